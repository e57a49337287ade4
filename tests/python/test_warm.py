"""Warm start: a second process compiling the same models against the same
daemon is served entirely from the daemon's cache (zero new compiles), and
on the same node AOTAutograd's result comes from its cache (no re-trace);
a process on another node (no local AOTAutograd cache) still compiles
nothing."""
import os

from conftest import run_child

NAMES = ["mlp", "gpt"]


def _child(addr, aot_dir):
    return run_child("warm_child.py", NAMES, addr, aot_dir)


def test_second_process_compiles_nothing(own_daemon, tmp_path):
    d = own_daemon()
    node = tmp_path / "node1-aot"
    cold = _child(d.addr, node)
    after_cold = d.stats()
    print("cold child:", cold)
    print("daemon after cold:", after_cold)
    assert cold["kernels"] > 0 and cold["cache_miss"] > 0
    assert after_cold["compiles"] > 0

    assert cold["aot_cache_hits"] == 0
    warm = _child(d.addr, node)
    after_warm = d.stats()
    print("warm child:", warm)
    print("daemon after warm:", after_warm)
    # the daemon compiled nothing new and stored nothing new
    assert after_warm["compiles"] == after_cold["compiles"]
    assert after_warm["entries"] == after_cold["entries"]
    assert after_warm["hits"] > after_cold["hits"]
    # the only misses are trial compiles of ops the daemon already failed
    # to build (e.g. int64 arithmetic), which it answers from its negative
    # cache without compiling; no kernel request missed
    assert (after_warm["misses"] - after_cold["misses"]
            == after_warm["compile_failures"] - after_cold["compile_failures"])
    # every kernel of the warm process was a hit
    assert warm["cache_miss"] == 0 and warm["cache_coalesced"] == 0
    assert warm["cache_hit"] == warm["kernels"] == cold["kernels"]
    assert warm["compiled_ops"] == cold["compiled_ops"]
    # same node: every AOTAutograd graph (foo's inference graph, each
    # model's forward and backward) came from the AOTAutograd cache
    assert warm["aot_cache_hits"] == warm["graphs"] == cold["graphs"] >= 1 + 2 * len(NAMES)
    # ... and every one was set up from the recipe the cold process saved
    assert cold["aot_recipe_hits"] == 0 and warm["aot_recipe_hits"] == warm["graphs"]
    assert all(f.startswith("tccd") for f in os.listdir(node / "aotautograd")), \
        "tccd's AOTAutograd entries live under keys of their own"

    # another node: the daemon still serves every kernel; AOTAutograd traces
    node2 = _child(d.addr, tmp_path / "node2-aot")
    after_node2 = d.stats()
    assert node2["aot_cache_hits"] == node2["aot_recipe_hits"] == 0
    assert after_node2["compiles"] == after_cold["compiles"]
    assert node2["cache_miss"] == 0 and node2["cache_hit"] == cold["kernels"]
