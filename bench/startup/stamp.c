/* The measured program (FRE §6.1): prints CLOCK_MONOTONIC in nanoseconds as the first
 * thing main does. With the argument "sleep" it then waits forever (idle memory). */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  printf("%lld\n", (long long)t.tv_sec * 1000000000LL + t.tv_nsec);
  fflush(stdout);
  if (argc > 1 && !strcmp(argv[1], "sleep"))
    for (;;) pause();
  return 0;
}
