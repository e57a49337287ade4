/* files.c — scratch directories, whole files, child processes (see
 * tcctest.h). */
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tcctest.h"

char *tt_tmpdir(const char *tag) {
  const char *base = getenv("TMPDIR");
  char *path = NULL;
  if (asprintf(&path, "%s/tcc-%s-XXXXXX", base && *base ? base : "/tmp", tag) < 0) return NULL;
  if (!mkdtemp(path)) {
    free(path);
    return NULL;
  }
  return path;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

int tt_remove_tree(const char *path) { return nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS); }

int tt_dir_entries(const char *path) {
  DIR *d = opendir(path);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

char *tt_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
      (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (!buf) return NULL;
  buf[n] = '\0';
  if (len) *len = (size_t)n;
  return buf;
}

int tt_write_file(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int ok = fwrite(data, 1, len, f) == len;
  return fclose(f) == 0 && ok ? 0 : -1;
}

int tt_run(char *const argv[], const char *stdin_path, const char *stdout_path, const char *stderr_path) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    const char *paths[3] = {stdin_path, stdout_path, stderr_path};
    for (int fd = 0; fd < 3; fd++) {
      if (!paths[fd]) continue;
      int f = fd == 0 ? open(paths[fd], O_RDONLY) : open(paths[fd], O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (f < 0 || dup2(f, fd) < 0) _exit(126);
      close(f);
    }
    execvp(argv[0], argv);
    _exit(127);
  }
  int st;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

char *tt_popen(const char *cmd, int *status) {
  fflush(NULL);
  FILE *p = popen(cmd, "r");
  if (!p) return NULL;
  size_t cap = 1 << 16, len = 0, n;
  char *out = malloc(cap);
  while (out && (n = fread(out + len, 1, cap - len - 1, p)) > 0) {
    len += n;
    if (len + 1 == cap) {
      char *bigger = realloc(out, cap *= 2);
      if (!bigger) free(out);
      out = bigger;
    }
  }
  int st = pclose(p);
  if (status) *status = st;
  if (out) out[len] = '\0';
  return out;
}
