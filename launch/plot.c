/* plot.c - metrics.jsonl -> metrics.png with gnuplot (Debian gnuplot-nox). */
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/io/atomic.h"
#include "kernels/status.h"
#include "launch/train.h"

/* Splits metrics.jsonl into step.dat (step loss) and eval.dat (step loss
 * accuracy) for the validation split; returns how many eval rows (-1 when
 * metrics.jsonl cannot be read or is not a regular file - /dev/zero would
 * never end - with the error recorded), the step rows into *n_steps. */
static int write_data(const char *run_dir, FILE *steps, FILE *evals, int *n_steps) {
    char path[1200], line[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    int fd;
    if (ts_io_open_regular(path, "metrics", &fd)) return -1;
    FILE *f = fdopen(fd, "r");
    if (!f) {
        ts_error(TS_ERR_IO, "metrics %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    int n_eval = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j) continue;
        const char *kind = json_string_value(json_object_get(j, "kind"));
        const char *split = json_string_value(json_object_get(j, "split"));
        json_int_t step = json_integer_value(json_object_get(j, "step"));
        double loss = json_number_value(json_object_get(j, "loss"));
        if (kind && !strcmp(kind, "step")) {
            fprintf(steps, "%lld %g\n", (long long)step, loss);
            (*n_steps)++;
        }
        if (kind && !strcmp(kind, "eval") && split && !strcmp(split, "val")) {
            double acc = json_number_value(json_object_get(j, "accuracy"));
            double bpb = json_number_value(json_object_get(j, "bpb"));
            fprintf(evals, "%lld %g %g\n", (long long)step, loss, acc >= 0 ? 100 * acc : bpb);
            n_eval++;
        }
        json_decref(j);
    }
    fclose(f);
    return n_eval;
}

/* Draws the step rows of sp and the n_eval eval rows of ep into the PNG
 * out with gnuplot; 0, or 1 after a message. */
static int draw(const char *sp, const char *ep, int n_eval, const char *out) {
    FILE *g = popen("gnuplot 2>/dev/null", "w");
    if (!g) {
        fprintf(stderr, "tessera-run --plot: gnuplot is not available\n");
        return 1;
    }
    fprintf(g, "set terminal png size 1100,420\nset output '%s'\nset multiplot layout 1,2\n", out);
    fprintf(g, "set title 'loss'\nset xlabel 'step'\nset grid\n");
    fprintf(g, "plot '%s' using 1:2 with lines title 'train'", sp);
    if (n_eval) fprintf(g, ", '%s' using 1:2 with linespoints title 'validation'", ep);
    fprintf(g, "\n");
    if (n_eval) fprintf(g, "set title 'validation accuracy %% (or bits/byte)'\nplot '%s' using 1:3 with linespoints notitle\n", ep);
    fprintf(g, "unset multiplot\n");
    int rc = pclose(g);
    if (rc != 0) {
        fprintf(stderr, "tessera-run --plot: gnuplot failed (%s %d)\n", WIFEXITED(rc) ? "exit" : "signal",
                WIFEXITED(rc) ? WEXITSTATUS(rc) : WTERMSIG(rc));
        return 1;
    }
    return 0;
}

/* The chart is drawn into a temp file renamed onto metrics.png once gnuplot
 * succeeded from data files written whole, so a failure (a full disk among
 * them) leaves an earlier chart as it was; the data files go either way. */
int ts_launch_plot(const char *run_dir, char *png, size_t cap) {
    char sp[1200], ep[1200], tmp[1300];
    snprintf(sp, sizeof sp, "%s/plot-steps.dat", run_dir);
    snprintf(ep, sizeof ep, "%s/plot-evals.dat", run_dir);
    snprintf(png, cap, "%s/metrics.png", run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", png, (long)getpid());
    FILE *steps = fopen(sp, "w"), *evals = steps ? fopen(ep, "w") : NULL;
    int err = errno, n_steps = 0, n_eval = steps && evals ? write_data(run_dir, steps, evals, &n_steps) : -1;
    /* a write that failed (a full disk) would draw a truncated chart; both are closed ('&') */
    bool written = (!steps || !ts_io_close_synced(steps, sp)) & (!evals || !ts_io_close_synced(evals, ep));
    int rc = 1;
    if (!steps || !evals)
        fprintf(stderr, "tessera-run --plot: cannot write %s: %s\n", steps ? ep : sp, strerror(err));
    else if (n_eval < 0 || !written) fprintf(stderr, "tessera-run --plot: %s\n", ts_last_error());
    else if (!n_steps && !n_eval)
        fprintf(stderr, "tessera-run --plot: %s/metrics.jsonl holds no step or evaluation to draw\n", run_dir);
    else rc = draw(sp, ep, n_eval, tmp);
    remove(sp);
    remove(ep);
    if (!rc && rename(tmp, png) != 0) {
        fprintf(stderr, "tessera-run --plot: cannot rename %s to %s: %s\n", tmp, png, strerror(errno));
        rc = 1;
    }
    if (rc) remove(tmp);
    return rc;
}
