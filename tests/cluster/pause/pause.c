/* The pod sandbox's process for the real nodes of tests/cluster: it holds the pod's
 * namespaces for as long as the pod lives, does nothing else, and exits 0 on SIGINT or
 * SIGTERM. As PID 1 of a pod that shares its PID namespace it also reaps orphans, which
 * would otherwise stay zombies. Built statically (install-tools.sh) into a one-file image. */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signo) {
  (void)signo;
  _exit(0);
}

static void reap(int signo) {
  (void)signo;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

static void handle(int signo, void (*handler)(int), int flags) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = handler;
  action.sa_flags = flags;
  sigemptyset(&action.sa_mask);
  if (sigaction(signo, &action, NULL) != 0) {
    static const char msg[] = "pause: sigaction failed\n";
    (void)write(2, msg, sizeof msg - 1);
    _exit(1);
  }
}

int main(void) {
  handle(SIGINT, stop, 0);
  handle(SIGTERM, stop, 0);
  handle(SIGCHLD, reap, SA_NOCLDSTOP | SA_RESTART);
  for (;;) pause();
}
