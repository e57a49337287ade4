/*
 * build.c — the CPU target's build: C source -> shared object bytes,
 * with the system compiler.
 *
 * Requires: C source from emit.c.
 * Produces: the bytes of a .so built as
 *
 *   <cc> -std=c11 -O3 -march=<isa> [-m<feature>...] -fPIC -shared
 *        -ffp-contract=off -fno-math-errno -fno-trapping-math
 *        -o kernel.so kernel.c -lm
 *        [-fopenmp] [-pthread -ldnnl]
 *        [-L<openblas libdir> -Wl,-rpath,<libdir> -lopenblas]
 *
 * -fopenmp when the source has OpenMP pragmas (parallel loops, simd
 * reductions); oneDNN when it has convolution steps (conv.c) or float32
 * GEMM steps (emit.c's emit_dnnl_gemm); OpenBLAS when it has other GEMM
 * steps (float64, or oneDNN off).
 *
 * in a private directory made with mkdtemp under work_dir (or $TMPDIR, or
 * /tmp), removed afterwards unless keep_sources is set. -ffp-contract=off
 * keeps a*b+c two roundings, as PyTorch's scalar kernels round;
 * -fno-math-errno only drops errno writes, which nothing reads;
 * -fno-trapping-math (as PyTorch builds its own kernels) lets gcc compute
 * both sides of a select and blend them, since nothing reads the FP
 * exception flags: without it a ReLU backward's mask became a branch
 * that random signs mispredict half the time (194 -> 13 us for 32K
 * elements). Neither changes a result.
 * -march comes from the verified target (one of four ISA names) and the
 * features from a fixed list (verify.c), so no request string reaches the
 * command line unchecked.
 *
 * THE OBJECT CACHE (opts->object_dir; issue 22)
 *
 * A source with shared kernel bodies (emit.c) is built in three steps
 * instead, so that a body compiled for one artifact serves every later
 * artifact that has it -- the same layer in another model, the forward
 * of an inference graph and of a training graph:
 *
 *   cc <flags> -ffunction-sections -fdata-sections -c kernel.c
 *      -DTCC_HAVE_B<id>...       (bodies the cache holds: not compiled)
 *   objcopy -w --keep-global-symbol='tcc_b*' --keep-global-symbol='tcc_share*'
 *      kernel.o  ->  the cache
 *      (when it compiled new bodies: their object, everything but the
 *      bodies and the GEMM helper's runtime (cpu/share.c, weak) local)
 *   cc -shared kernel.o <cached objects> -Wl,--gc-sections -lm ...
 *      (the linker keeps what is reachable from tcc_entry)
 *
 *   object_dir/<sha256 of the object>.o       the objects, content-addressed
 *   object_dir/index/<key>                    "tccd-object/1 <object sha256> <needs>"
 *
 * A body's key is SHA-256 over the compiler identity (opts->identity),
 * the compile flags, the source's preamble (the text before
 * TCC_CPU_PREAMBLE_END, which is all a body depends on besides its own
 * text) and the body's text. <needs> says what linking the object takes
 * (OpenMP, oneDNN, OpenBLAS). Every object read is checked against its
 * name's digest and copied into the private build directory first, so a
 * damaged file is a miss (and removed), and pruning by another worker
 * cannot pull a file from under a link. Bodies are weak: one that two
 * linked objects both hold is linked once. Files are written to a
 * temporary name and renamed. Past object_max_bytes the least recently
 * used objects go (their index entries then miss). A link that fails with
 * cached objects is built again without the cache: the cache can cost a
 * build time, never a failure.
 */
#include "cpu_schedule.h"
#include "tcc_config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A build directory that cannot be made, written or read says nothing
 * about the graph: a full disk (or quota) is RESOURCE_EXHAUSTED, anything
 * else UNAVAILABLE; both are transient, never cached. */
static int io_failure_class(int e) {
  return e == ENOSPC || e == EDQUOT || e == ENOMEM || e == EFBIG ? TCC_E_RESOURCE_EXHAUSTED : TCC_E_UNAVAILABLE;
}

static int write_file(const char *path, const char *data, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  while (len) {
    ssize_t w = write(fd, data, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      close(fd);
      return -1;
    }
    data += w;
    len -= (size_t)w;
  }
  return close(fd);
}

/* Reads a whole file into *out (malloc'ed). Returns 0 or -1 (errno). */
static int read_file(const char *path, uint8_t **out, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) || st.st_size < 0) {
    close(fd);
    return -1;
  }
  size_t n = (size_t)st.st_size, got = 0;
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) {
    close(fd);
    errno = ENOMEM;
    return -1;
  }
  while (got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (got != n) {
    free(buf);
    errno = EIO;
    return -1;
  }
  *out = buf;
  *len = n;
  return 0;
}

/* ------------------------------------------------------------ the object cache */

enum { NEED_OMP = 1, NEED_DNNL = 2, NEED_BLAS = 4 };
#define OBJECT_CACHE_DEFAULT_MAX (256LL << 20)
#define OBJECT_INDEX_MAGIC "tccd-object/1"

typedef struct cached_obj {
  char hex[TCC_SHA256_HEX];  /* its digest: object_dir/<hex>.o */
  uint8_t *data;
  size_t len;
  unsigned needs;
} cached_obj;

typedef struct body_ref {
  char id[TCC_BODY_ID_HEX + 1];
  char key[TCC_SHA256_HEX];  /* object_dir/index/<key> */
  int obj;                   /* in objs, or -1: compiled here */
} body_ref;

typedef struct objcache {
  const char *dir;
  body_ref *bodies;
  int n, reused;
  cached_obj *objs;
  int nobjs;
} objcache;

static void objcache_free(objcache *oc) {
  for (int i = 0; i < oc->nobjs; i++) free(oc->objs[i].data);
  free(oc->objs);
  free(oc->bodies);
  memset(oc, 0, sizeof *oc);
}

/* Finds the source's bodies (from "#ifndef TCC_HAVE_B<id>" to its "#endif" line)
 * and their keys. Returns the number found (0: no object cache for this
 * source), or -1 when out of memory. */
static int objcache_scan(objcache *oc, const char *src, const char *identity, const char *const *flags,
                         int nflags) {
  const char *pre = strstr(src, "*/\n"), *pre_end = strstr(src, TCC_CPU_PREAMBLE_END);
  if (!pre || !pre_end || pre_end < pre) return 0;
  tcc_sha256_ctx base;
  tcc_sha256_init(&base);
  tcc_sha256_update(&base, OBJECT_INDEX_MAGIC, sizeof OBJECT_INDEX_MAGIC);
  tcc_sha256_update(&base, identity ? identity : "", strlen(identity ? identity : "") + 1);
  for (int i = 0; i < nflags; i++) tcc_sha256_update(&base, flags[i], strlen(flags[i]) + 1);
  tcc_sha256_update(&base, pre, (size_t)(pre_end - pre));
  static const char open_tag[] = "#ifndef TCC_HAVE_B";
  int cap = 0;
  for (const char *q = strstr(pre_end, open_tag); q; q = strstr(q, open_tag)) {
    const char *id = q + sizeof open_tag - 1;
    char close_tag[48];
    snprintf(close_tag, sizeof close_tag, "#endif /* B%.*s */\n", TCC_BODY_ID_HEX, id);
    const char *end = strstr(id, close_tag);
    if (!end || strspn(id, "0123456789abcdef") != TCC_BODY_ID_HEX) return 0; /* not emit.c's form */
    end += strlen(close_tag);
    if (oc->n == cap) {
      body_ref *more = realloc(oc->bodies, sizeof *more * (size_t)(cap = cap ? cap * 2 : 32));
      if (!more) return -1;
      oc->bodies = more;
    }
    body_ref *b = &oc->bodies[oc->n++];
    memcpy(b->id, id, TCC_BODY_ID_HEX);
    b->id[TCC_BODY_ID_HEX] = '\0';
    b->obj = -1;
    tcc_sha256_ctx h = base;
    tcc_sha256_update(&h, q, (size_t)(end - q));
    uint8_t key[TCC_SHA256_BYTES];
    tcc_sha256_final(&h, key);
    tcc_hex_encode(key, TCC_SHA256_BYTES, b->key);
    q = end;
  }
  return oc->n;
}

/* Reads object hex (verified against its name) into oc->objs, once.
 * Returns its index, or -1 (missing, damaged: removed, out of memory). */
static int objcache_load(objcache *oc, const char *hex, unsigned needs) {
  for (int i = 0; i < oc->nobjs; i++)
    if (strcmp(oc->objs[i].hex, hex) == 0) return i;
  char path[4200];
  snprintf(path, sizeof path, "%s/%s.o", oc->dir, hex);
  uint8_t *data;
  size_t len;
  if (read_file(path, &data, &len) != 0) return -1;
  uint8_t digest[TCC_SHA256_BYTES];
  char got[TCC_SHA256_HEX];
  tcc_sha256(data, len, digest);
  tcc_hex_encode(digest, TCC_SHA256_BYTES, got);
  if (strcmp(got, hex) != 0) {
    free(data);
    unlink(path); /* damaged: gone, and its bodies compile again */
    return -1;
  }
  cached_obj *more = realloc(oc->objs, sizeof *more * (size_t)(oc->nobjs + 1));
  if (!more) {
    free(data);
    return -1;
  }
  oc->objs = more;
  cached_obj *o = &oc->objs[oc->nobjs];
  snprintf(o->hex, sizeof o->hex, "%s", hex);
  o->data = data;
  o->len = len;
  o->needs = needs;
  utimensat(AT_FDCWD, path, NULL, 0); /* recently used: pruned last */
  return oc->nobjs++;
}

/* Looks every body up in the index; a hit's object is loaded. */
static void objcache_lookup(objcache *oc) {
  for (int i = 0; i < oc->n; i++) {
    body_ref *b = &oc->bodies[i];
    char path[4200], line[160] = "", hex[TCC_SHA256_HEX];
    snprintf(path, sizeof path, "%s/index/%s", oc->dir, b->key);
    FILE *f = fopen(path, "re");
    if (!f) continue;
    int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    unsigned needs = 0;
    if (!ok || sscanf(line, OBJECT_INDEX_MAGIC " %64[0-9a-f] %u", hex, &needs) != 2 || strlen(hex) != 64) continue;
    b->obj = objcache_load(oc, hex, needs);
    if (b->obj >= 0) oc->reused++;
    else unlink(path);
  }
}

/* Writes data to dir/name through a temporary file and a rename. */
static int write_atomic(const char *dir, const char *name, const void *data, size_t len) {
  char tmp[4200], path[4200];
  snprintf(tmp, sizeof tmp, "%s/.tmp-XXXXXX", dir);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = mkstemp(tmp);
  if (fd < 0) return -1;
  const char *p = data;
  size_t left = len;
  while (left) {
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    p += w;
    left -= (size_t)w;
  }
  if (close(fd) != 0 || left || rename(tmp, path) != 0) {
    unlink(tmp);
    return -1;
  }
  return 0;
}

typedef struct obj_file { char name[TCC_SHA256_HEX + 2]; int64_t size; struct timespec used; } obj_file;

static int by_use(const void *a, const void *b) {
  const obj_file *x = a, *y = b;
  if (x->used.tv_sec != y->used.tv_sec) return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
  return (x->used.tv_nsec > y->used.tv_nsec) - (x->used.tv_nsec < y->used.tv_nsec);
}

/* Removes the least recently used objects while they hold more than max
 * bytes, down to 3/4 of it. */
static void objcache_prune(const char *dir, int64_t max) {
  DIR *d = opendir(dir);
  if (!d) return;
  obj_file *files = NULL;
  size_t n = 0, cap = 0;
  int64_t total = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t nl = strlen(e->d_name);
    struct stat st;
    if (nl != TCC_SHA256_HEX - 1 + 2 || strcmp(e->d_name + nl - 2, ".o") != 0) continue;
    if (fstatat(dirfd(d), e->d_name, &st, 0) != 0) continue;
    if (n == cap) {
      obj_file *more = realloc(files, sizeof *more * (cap = cap ? cap * 2 : 256));
      if (!more) break;
      files = more;
    }
    snprintf(files[n].name, sizeof files[n].name, "%s", e->d_name);
    files[n].size = st.st_size;
    files[n].used = st.st_mtim;
    total += st.st_size;
    n++;
  }
  if (total > max) {
    qsort(files, n, sizeof *files, by_use);
    for (size_t i = 0; i < n && total > max / 4 * 3; i++)
      if (unlinkat(dirfd(d), files[i].name, 0) == 0) total -= files[i].size;
  }
  closedir(d);
  free(files);
}

/* Stores kernel.o (at obj_path) as the object of the bodies this build
 * compiled: everything but the bodies made local, named by its digest,
 * indexed under each new body's key. Best effort: the build goes on
 * without it. */
static void objcache_store(objcache *oc, const char *obj_path, const char *build_dir, unsigned needs,
                           const tcc_build_options *opts, int timeout) {
  int fresh = 0;
  for (int i = 0; i < oc->n; i++) fresh += oc->bodies[i].obj < 0;
  if (!fresh) return;
  char shared[4200], index_dir[4200];
  snprintf(shared, sizeof shared, "%s/share.o", build_dir);
  snprintf(index_dir, sizeof index_dir, "%s/index", oc->dir);
  if ((mkdir(oc->dir, 0700) != 0 && errno != EEXIST) || (mkdir(index_dir, 0700) != 0 && errno != EEXIST)) return;
  const char *argv[] = {"objcopy", "-w", "--keep-global-symbol=tcc_b*", "--keep-global-symbol=tcc_share*", obj_path,
                        shared, NULL};
  char *output = NULL;
  tcc_error err;
  int rc = tcc_run_tool(argv, timeout, &output, &err);
  free(output);
  uint8_t *data = NULL;
  size_t len = 0;
  if (rc != 0 || read_file(shared, &data, &len) != 0) {
    unlink(shared);
    return;
  }
  unlink(shared);
  uint8_t digest[TCC_SHA256_BYTES];
  char hex[TCC_SHA256_HEX], name[TCC_SHA256_HEX + 2], line[128];
  tcc_sha256(data, len, digest);
  tcc_hex_encode(digest, TCC_SHA256_BYTES, hex);
  snprintf(name, sizeof name, "%s.o", hex);
  int ok = write_atomic(oc->dir, name, data, len) == 0;
  free(data);
  if (!ok) return;
  int n = snprintf(line, sizeof line, OBJECT_INDEX_MAGIC " %s %u\n", hex, needs);
  for (int i = 0; i < oc->n; i++)
    if (oc->bodies[i].obj < 0) write_atomic(index_dir, oc->bodies[i].key, line, (size_t)n);
  objcache_prune(oc->dir, opts->object_max_bytes > 0 ? opts->object_max_bytes : OBJECT_CACHE_DEFAULT_MAX);
}

/* What linking this program takes (NEED_*). */
static unsigned link_needs(const tcc_program *p, const char *src) {
  unsigned needs = 0;
  if (strstr(src, "#pragma omp") || strstr(src, "omp_set_num_threads")) needs |= NEED_OMP;
  for (int k = 0; k < p->nkernels; k++)
    if (!p->kernels[k].dead && p->kernels[k].kind == TCC_OPK_EXTERN) {
      const tcc_vx *call = p->kernels[k].stores[0].value;
      if (call->i == TCC_EXT_INDEX_ADD_ROWS)
        continue;                                   /* plain C */
      if (call->i == TCC_EXT_GEMM && (call->dtype != TCC__V1__DTYPE__FLOAT32 || !tcc_onednn_enabled()))
        needs |= NEED_BLAS;
      else
        needs |= NEED_DNNL;
    }
  return needs;
}

/* Appends the libraries `needs` asks for to argv at *a. */
static void add_libs(const char **argv, int *a, unsigned needs) {
  argv[(*a)++] = "-lm";
  if (needs & NEED_OMP) argv[(*a)++] = "-fopenmp";
  if (needs & NEED_DNNL) {
    argv[(*a)++] = "-pthread";
    argv[(*a)++] = "-ldnnl";
  }
  if (needs & NEED_BLAS) {
#ifdef TCC_OPENBLAS_LIBDIR
    argv[(*a)++] = "-L" TCC_OPENBLAS_LIBDIR;
    argv[(*a)++] = "-Wl,-rpath," TCC_OPENBLAS_LIBDIR;
#endif
    argv[(*a)++] = "-lopenblas";
  }
}

static int run(const char **argv, int timeout, const char *what, tcc_error *err) {
  char *output = NULL;
  int rc = tcc_run_tool(argv, timeout, &output, err);
  free(output);
  if (rc) tcc_error_prefix(err, "%s", what);
  return rc;
}

/* build_with_objects' answers besides 0 and the (negative) TCC_E_* codes */
enum { OBJECTS_UNUSED = 1, OBJECTS_RETRY = 2 };

/* The build through the object cache: compile (without the bodies it
 * holds), store the new bodies' object, link. Returns 0, OBJECTS_UNUSED
 * when the cache does not apply (nothing done), OBJECTS_RETRY when the
 * link failed with cached objects (removed: build again), or a TCC_E_*
 * code (the build failed). */
static int build_with_objects(const tcc_program *p, const char *src, const tcc_build_options *opts,
                              const char *dir, const char *cfile, const char *sofile, const char *const *flags,
                              int nflags, int timeout, tcc_built *out, tcc_error *err) {
  const char *off = getenv("TCC_NO_OBJECT_CACHE"); /* benchmarks of the road without */
  if (!opts || !opts->object_dir || !opts->object_dir[0] || (off && off[0] && strcmp(off, "0") != 0))
    return OBJECTS_UNUSED;
  objcache oc = {.dir = opts->object_dir};
  int nb = objcache_scan(&oc, src, opts->identity, flags, nflags);
  if (nb <= 0) {
    objcache_free(&oc);
    return OBJECTS_UNUSED;
  }
  objcache_lookup(&oc);
  unsigned needs = link_needs(p, src);
  size_t cap = (size_t)nflags + (size_t)oc.n + (size_t)oc.nobjs + 32;
  const char **argv = calloc(cap, sizeof *argv);
  char (*defs)[TCC_BODY_ID_HEX + 16] = calloc((size_t)oc.n + 1, sizeof *defs);
  char (*objs)[4200] = calloc((size_t)oc.nobjs + 1, sizeof *objs);
  char ofile[4200];
  int rc = 0, a = 0;
  if (!argv || !defs || !objs) {
    rc = tcc_error_set(err, TCC_E_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  snprintf(ofile, sizeof ofile, "%s/kernel.o", dir);
  for (int i = 0; i < oc.nobjs; i++) { /* private copies: nothing can change under the link */
    snprintf(objs[i], sizeof objs[i], "%s/c%d.o", dir, i);
    if (write_file(objs[i], (const char *)oc.objs[i].data, oc.objs[i].len) != 0) {
      rc = tcc_error_set(err, io_failure_class(errno), "cannot write %s: %s", objs[i], strerror(errno));
      goto done;
    }
    needs |= oc.objs[i].needs;
  }
  argv[a++] = flags[0];
  for (int i = 1; i < nflags; i++) argv[a++] = flags[i];
  argv[a++] = "-ffunction-sections";
  argv[a++] = "-fdata-sections";
  argv[a++] = "-c";
  argv[a++] = "-o";
  argv[a++] = ofile;
  argv[a++] = cfile;
  if (needs & NEED_OMP) argv[a++] = "-fopenmp";
  for (int i = 0; i < oc.n; i++)
    if (oc.bodies[i].obj >= 0) {
      snprintf(defs[i], sizeof defs[i], "-DTCC_HAVE_B%s", oc.bodies[i].id);
      argv[a++] = defs[i];
    }
  argv[a] = NULL;
  if ((rc = run(argv, timeout, "building the kernel", err))) goto done;
  objcache_store(&oc, ofile, dir, link_needs(p, src), opts, timeout);

  a = 0;
  argv[a++] = flags[0];
  argv[a++] = "-shared";
  argv[a++] = "-o";
  argv[a++] = sofile;
  argv[a++] = ofile;
  for (int i = 0; i < oc.nobjs; i++) argv[a++] = objs[i];
  argv[a++] = "-Wl,--gc-sections";
  add_libs(argv, &a, needs);
  argv[a] = NULL;
  rc = run(argv, timeout, "linking the kernel", err);
  if (rc == 0 && read_file(sofile, &out->data, &out->size) != 0)
    rc = tcc_error_set(err, io_failure_class(errno), "cannot read the built %s: %s", sofile, strerror(errno));
  if (rc == 0) {
    out->bodies = oc.n;
    out->bodies_reused = oc.reused;
  } else if (oc.reused && rc != TCC_E_DEADLINE_EXCEEDED && rc != TCC_E_CANCELLED) {
    for (int i = 0; i < oc.nobjs; i++) { /* suspects: gone, and their bodies compile again */
      char path[4200];
      snprintf(path, sizeof path, "%s/%s.o", oc.dir, oc.objs[i].hex);
      unlink(path);
    }
    rc = OBJECTS_RETRY;
  }
done:
  if (!opts->keep_sources) {
    unlink(ofile);
    unlink(sofile);
    for (int i = 0; objs && i < oc.nobjs; i++) unlink(objs[i]);
  }
  free(argv);
  free(defs);
  free(objs);
  objcache_free(&oc);
  return rc;
}

int tcc_cpu_build(const tcc_program *p, const char *src, size_t len, const tcc_build_options *opts,
                  tcc_built *out, tcc_error *err) {
  const tcc_graph *g = p->graph;
  memset(out, 0, sizeof *out);
  const char *cc = opts && opts->cc && opts->cc[0] ? opts->cc : TCC_CC_DEFAULT;
  const char *base = opts && opts->work_dir && opts->work_dir[0] ? opts->work_dir : getenv("TMPDIR");
  if (!base || !base[0]) base = "/tmp";
  int timeout = opts && opts->timeout_ms > 0 ? opts->timeout_ms : 120000;
  int keep = opts && opts->keep_sources;

  char dir[4096], cfile[4200], sofile[4200], march[64];
  if ((size_t)snprintf(dir, sizeof dir, "%s/tccd-build-XXXXXX", base) >= sizeof dir)
    return tcc_error_set(err, TCC_E_INVALID_ARGUMENT, "work_dir path too long");
  if (!mkdtemp(dir))
    return tcc_error_set(err, io_failure_class(errno), "cannot create a build directory under '%s': %s",
                         base, strerror(errno));
  snprintf(cfile, sizeof cfile, "%s/kernel.c", dir);
  snprintf(sofile, sizeof sofile, "%s/kernel.so", dir);
  snprintf(march, sizeof march, "-march=%s", g->target.isa);

  int rc;
  if (write_file(cfile, src, len)) {
    rc = tcc_error_set(err, io_failure_class(errno), "cannot write %s: %s", cfile, strerror(errno));
    goto done;
  }
  /* the compile flags: the object cache's keys cover them */
  const char *flags[16 + 64];
  char feat[64][40];
  int nflags = 0;
  flags[nflags++] = cc;
  flags[nflags++] = "-std=c11";
  flags[nflags++] = "-O3";
  flags[nflags++] = march;
  for (int i = 0; i < g->target.nfeatures && i < 64; i++) {
    snprintf(feat[i], sizeof feat[i], "-m%s", g->target.features[i]);
    flags[nflags++] = feat[i];
  }
  flags[nflags++] = "-fPIC";
  flags[nflags++] = "-ffp-contract=off";
  flags[nflags++] = "-fno-math-errno";
  flags[nflags++] = "-fno-trapping-math";
  rc = build_with_objects(p, src, opts, dir, cfile, sofile, flags, nflags, timeout, out, err);
  if (rc == OBJECTS_RETRY) /* once more, every body compiled here */
    rc = build_with_objects(p, src, opts, dir, cfile, sofile, flags, nflags, timeout, out, err);
  if (rc != OBJECTS_UNUSED && rc != OBJECTS_RETRY) goto done; /* built, or failed */

  const char *argv[32 + 64];
  int a = 0;
  for (int i = 0; i < nflags; i++) argv[a++] = flags[i];
  argv[a++] = "-shared";
  argv[a++] = "-o";
  argv[a++] = sofile;
  argv[a++] = cfile;
  add_libs(argv, &a, link_needs(p, src));
  argv[a] = NULL;
  if ((rc = run(argv, timeout, "building the kernel", err))) goto done;
  if (read_file(sofile, &out->data, &out->size)) {
    rc = tcc_error_set(err, io_failure_class(errno), "cannot read the built %s: %s", sofile, strerror(errno));
    goto done;
  }
done:
  if (!keep) {
    unlink(sofile);
    unlink(cfile);
    rmdir(dir);
  }
  return rc;
}
