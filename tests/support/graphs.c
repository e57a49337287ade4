/* graphs.c — the example graphs, the .json files of tests/graphs (see
 * tcctest.h). meson compiles in TCC_TEST_GRAPHS_DIR, the source tree's
 * copy. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcctest.h"

#ifndef TCC_TEST_GRAPHS_DIR
#define TCC_TEST_GRAPHS_DIR "tests/graphs"
#endif

const char *tt_graphs_dir(void) {
  const char *env = getenv("TCC_GRAPHS");
  return env && *env ? env : TCC_TEST_GRAPHS_DIR;
}

const char *tt_graph_path(const char *name) {
  static char path[4096];
  snprintf(path, sizeof path, "%s/%s", tt_graphs_dir(), name);
  return path;
}

char *tt_graph_read(const char *name, size_t *len) { return tt_read_file(tt_graph_path(name), len); }

static int is_json(const struct dirent *e) {
  size_t l = strlen(e->d_name);
  return l > 5 && !strcmp(e->d_name + l - 5, ".json");
}

static void release(tt_graph *g) {
  free(g->json);
  g->json = NULL;
}

int tt_graph_next(tt_graph *g) {
  release(g);
  if (!g->names_) {
    struct dirent **list;
    int n = scandir(tt_graphs_dir(), &list, is_json, alphasort);
    ck_assert_msg(n >= 0, "cannot read the example graphs in %s (TCC_GRAPHS)", tt_graphs_dir());
    g->names_ = calloc((size_t)n + 1, sizeof *g->names_);
    ck_assert_ptr_nonnull(g->names_);
    for (int i = 0; i < n; i++) {
      g->names_[i] = strdup(list[i]->d_name);
      free(list[i]);
    }
    free(list);
    g->count = n;
    g->index = -1;
  }
  if (++g->index >= g->count) {
    for (int i = 0; i < g->count; i++) free(g->names_[i]);
    free(g->names_);
    g->names_ = NULL;
    g->name = NULL;
    return 0;
  }
  g->name = g->names_[g->index];
  g->json = tt_graph_read(g->name, &g->len);
  ck_assert_msg(g->json != NULL, "cannot read %s", tt_graph_path(g->name));
  return 1;
}
