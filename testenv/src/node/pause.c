/* The Pod sandbox's process (the "pause" container): it holds the Pod's namespaces, reaps the
 * orphans that end up with it, and exits on SIGTERM or SIGINT. Built static by testenv, so the
 * image holds this file alone. */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signal) {
    (void)signal;
    _exit(0);
}

static void reap(int signal) {
    (void)signal;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGTERM, &on_stop, NULL);
    sigaction(SIGINT, &on_stop, NULL);
    sigaction(SIGCHLD, &on_child, NULL);
    for (;;) {
        pause();
    }
}
