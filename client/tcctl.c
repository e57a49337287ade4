/* tcctl.c — placeholder while the CLI is written (see the next commit). */
#include <stdio.h>
int main(void) {
  fputs("tcctl: not implemented yet\n", stderr);
  return 1;
}
