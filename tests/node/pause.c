/*
 * pause: the sandbox ("infra") process of a pod, for the node test tier's stand-in of
 * registry.k8s.io/pause (tests/node/images.sh builds it with `gcc -static` into an image made
 * from scratch: USER 65535, ENTRYPOINT /pause).
 *
 * It holds the pod's namespaces and does nothing else, as Kubernetes' own build/pause does:
 *   - SIGINT and SIGTERM end it with status 0 (the runtime stops a sandbox with them);
 *   - SIGCHLD reaps every exited child: with a shared PID namespace it is PID 1, and orphans
 *     of the pod's containers are reparented to it;
 *   - each handler runs with every other signal blocked, so a stop request never interrupts a
 *     reap half-way; SIGHUP and SIGPIPE are ignored (there is no terminal and nothing to write
 *     to). Every other signal keeps its default action; as PID 1 of a PID namespace the kernel
 *     drops those sent from inside the namespace that have no handler.
 *   - otherwise it sleeps in pause(), forever.
 * `pause -v` prints its version and exits.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef VERSION
#define VERSION "dev"
#endif

static void on_stop(int signo) {
  static const char msg[] = "pause: shutting down on a stop signal\n";
  (void)signo;
  /* async-signal-safe calls only: write(2) and _exit(2) */
  ssize_t unused = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)unused;
  _exit(0);
}

static void reap(void) {
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

static void on_child(int signo) {
  int saved = errno;
  (void)signo;
  reap();
  errno = saved;
}

static int handle(int signo, void (*handler)(int), int flags) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sa.sa_flags = flags;
  sigfillset(&sa.sa_mask);
  return sigaction(signo, &sa, NULL);
}

int main(int argc, char **argv) {
  if (argc == 2 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
    printf("pause %s (probe-runner node-tier stand-in)\n", VERSION);
    return 0;
  }
  if (argc > 1) {
    fprintf(stderr, "usage: pause [-v]\n");
    return 64;
  }
  if (getpid() != 1) {
    /* Not an error: pause is also run outside a pod's PID namespace. */
    fprintf(stderr, "pause: warning: not PID 1 of a PID namespace\n");
  }
  if (handle(SIGINT, on_stop, 0) < 0 || handle(SIGTERM, on_stop, 0) < 0) {
    perror("pause: sigaction(stop)");
    return 1;
  }
  if (handle(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART) < 0) {
    perror("pause: sigaction(SIGCHLD)");
    return 2;
  }
  if (handle(SIGHUP, SIG_IGN, 0) < 0 || handle(SIGPIPE, SIG_IGN, 0) < 0) {
    perror("pause: sigaction(ignore)");
    return 3;
  }
  /* Children that exited before the SIGCHLD handler was installed. */
  reap();
  for (;;) {
    pause();
  }
  /* not reached */
  return 42;
}
