"""Mega-Cache: torch.compiler.save_cache_artifacts() in one process
carries tccd's AOTAutograd entries, and a process on another node (an
empty TORCHINDUCTOR_CACHE_DIR) that calls load_cache_artifacts() with
those bytes loads every graph instead of tracing it, while every kernel
still comes from the daemon's cache (zero new compiles). Both processes
check their outputs and gradients against eager on fresh random inputs
(mega_child.py, rtol 1e-4, atol 1e-5). The blob carries no recipes
(recipe.py): they stay on their node."""
import os

from conftest import run_child


def _child(addr, aot_dir, mode, blob):
    return run_child("mega_child.py", [mode, blob], addr, aot_dir)


def test_loaded_artifacts_start_another_node_warm(own_daemon, tmp_path):
    d = own_daemon()
    blob = tmp_path / "mega.bin"
    cold = _child(d.addr, tmp_path / "node1-aot", "save", blob)
    after_cold = d.stats()
    print("saving child:", cold)
    assert cold["aot_cache_hits"] == 0 and cold["cache_miss"] > 0
    # foo's inference graph, the MLP's forward and backward: one entry per
    # Dynamo graph (the backward is bundled with its forward), under tccd's keys
    saved = cold["mega"]["aot_autograd"]
    assert len(saved) == 2 and all(k.startswith("tccd") for k in saved), cold["mega"]

    node2 = tmp_path / "node2-aot"
    assert not node2.exists()
    warm = _child(d.addr, node2, "load", blob)
    after_warm = d.stats()
    print("loading child:", warm)
    assert sorted(warm["mega"]["aot_autograd"]) == sorted(saved)
    # torch records an entry it loads too: this node could pass them on
    assert sorted(warm["mega_again"]["aot_autograd"]) == sorted(saved)
    # every graph loaded from the blob's entries, none traced
    assert warm["aot_cache_hits"] == warm["graphs"] == cold["graphs"] == 3
    # ... and every kernel a daemon cache hit: nothing compiled anew
    assert warm["cache_miss"] == 0 and warm["cache_coalesced"] == 0
    assert warm["cache_hit"] == warm["kernels"] == cold["kernels"] > 0
    assert after_warm["compiles"] == after_cold["compiles"]
    assert after_warm["entries"] == after_cold["entries"]
    assert after_warm["hits"] > after_cold["hits"]
    # the recipes stay on the node that wrote them: the loading process
    # partitioned its graphs again and saved recipes of its own, which
    # its node's next process is set up from
    assert warm["aot_recipe_hits"] == 0
    assert len(os.listdir(node2 / "tccd" / "recipes")) == warm["graphs"]
