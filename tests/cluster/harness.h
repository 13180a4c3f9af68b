/* harness.h - real processes for the cluster tests.
 *
 * The test process makes itself a child subreaper, so any process that a
 * launcher leaves behind is re-parented to the test and th_leftovers() sees
 * it, alive or zombie. Processes started by th_start write stdout and stderr
 * (merged) to a file in the test's temporary folder; the helpers poll that
 * file for lines. Executables named without '/' come from TESSERA_BIN_DIR.
 */
#ifndef TS_TESTS_CLUSTER_HARNESS_H
#define TS_TESTS_CLUSTER_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct {
    pid_t pid;
    char out[4096]; /* merged stdout + stderr */
    int status;     /* th_wait result once waited, else -1 */
} th_proc;

/* Subreaper + a fresh temporary folder; returns the folder. */
const char *th_init(void);

/* Removes the temporary folder when keep is 0 (kept for a failed run). */
void th_finish(int keep);

/* Path of name inside the temporary folder (static buffer per call slot:
 * up to 64 results live at once). */
const char *th_path(const char *name);

/* Writes text to the file name in the temporary folder; returns its path. */
const char *th_write(const char *name, const char *text);

/* Starts argv (NULL-terminated) with output to the file "<tag>.out". */
th_proc th_start(const char *tag, const char *const *argv);

/* Waits up to timeout_ms for p to exit: its status (exit code, or 128 +
 * signal); on timeout kills its process group and returns -1. */
int th_wait(th_proc *p, int timeout_ms);

/* The output so far (malloc'd; free it). */
char *th_output(const th_proc *p);

/* Waits until p's output contains needle; 0 when it did within timeout_ms. */
int th_wait_for(const th_proc *p, const char *needle, int timeout_ms);

/* Waits until needle occurs at least n times in p's output; 0 when it did
 * within timeout_ms. */
int th_wait_count(const th_proc *p, const char *needle, int n, int timeout_ms);

/* Times needle occurs in p's output. */
int th_count(const th_proc *p, const char *needle);

/* Pid of the nth (0-based, by pid order) live child of parent whose command
 * name is comm (e.g. "tessera-worker"); -1 when there is none. */
pid_t th_child(pid_t parent, const char *comm, int nth);

/* The loss of each step logged in run_dir/metrics.jsonl into loss[step]
 * (steps 1..max; 0 where absent); returns the highest step read. */
int th_losses(const char *run_dir, double *loss, int max);

/* Fails the test unless run_dir/metrics.jsonl logs steps 1..steps each
 * once and in order (a job that went back must have cut the lines of the
 * steps it took again). */
void th_expect_steps_once(const char *run_dir, int steps);

/* The largest allocator peak (MiB) of the steps logged in
 * run_dir/metrics.jsonl; 0 when there are none. */
double th_peak_mib(const char *run_dir);

/* Rank and pid of the nth worker a tessera-run's output says joined
 * ("[run] worker rank R is pid P"); -1 when there are fewer. */
int th_joined_worker(const th_proc *p, int nth, pid_t *pid);

/* Pid of the scheduler a tessera-run started ("[run] scheduler is pid P"),
 * or -1. */
pid_t th_scheduler_pid(const th_proc *run);

/* Reaps every process re-parented to the test (not the th_proc ones) and
 * returns how many there were, waiting up to 500 ms for stragglers. */
int th_leftovers(void);

/* Prints p's output (for a failed assertion) and fails the test with why. */
void th_dump(const th_proc *p, const char *why);

/* Waits up to timeout_ms for needle in p's output; fails the test with the
 * output when it does not come. */
void th_expect_output(const th_proc *p, const char *needle, int timeout_ms);

/* ---- training jobs ---- */

/* Writes the job file name.json: model, data and optimizer of arch ("mlp":
 * hidden [64, 48, 32]; "mlp-wide": hidden [512, 512, 512], whose
 * activations MPI hands over only to a posted receive; "cnn" and "gpt", a small GPT whose embedding and
 * head are tied, both with clipping; "gpt-ckpt": that GPT with activation
 * checkpointing; "gpt-bf16": that GPT computing in bf16; "gpt-dropout":
 * with dropout 0.1; "gpt-wide" and "gpt-wide-bf16": 8 blocks of 256, whose
 * gradients outweigh the activations of a small batch), seed 5, steps,
 * batch, accum micro-batches, a log line
 * and a checkpoint every 10 steps; parallel is the "parallel" section's
 * body. Returns its path. */
const char *th_job_file(const char *name, const char *arch, int steps, int batch, int accum, const char *parallel);

/* Runs argv to completion (exit 0, the job ended after its final
 * evaluation) and reads its run folder's losses. */
void th_run_losses(const char *tag, const char *const *argv, const char *run_dir, double *loss, int steps);

/* Runs the job `name` (th_job_file's arguments) in the run folder of its
 * name, continuing from its checkpoints when resume, and reads the losses
 * of its steps. */
void th_run_job(const char *name, const char *arch, int steps, int batch, int accum, const char *parallel,
                bool resume, double *loss);

/* Starts a job whose evaluations outlast its steps (an MLP of two layers
 * of 1024, 40 steps of batch 32, a checkpoint every 10 steps and every 20
 * an evaluation of 30 % of Fashion-MNIST's training images) with 4
 * workers of strategy (down to 2; parallel_extra is spliced into
 * "parallel"), kills one that is not the leader as the evaluation of step
 * 20 starts, and fails unless a survivor abandoned that evaluation, the
 * job went on at 3 workers (the scheduler taking their steps also when
 * they moved back to a checkpoint), ran its final evaluation, every
 * evaluation logged scored the whole set and tessera-run exited 0. The
 * run folder is th_path(name). */
void th_kill_in_eval(const char *name, const char *strategy, const char *parallel_extra);

/* Runs the job `name` (th_job_file's "mlp", steps, batch, parallel) and
 * sends tessera-run SIGINT once the leader logged step at; fails unless
 * tessera-run exits 128 + SIGINT saying every worker stopped after the same
 * step K (the scheduler names it), metrics.jsonl ends at K, the run folder
 * (and a ps job's shard 0) holds a checkpoint of K, and the job resumed
 * with --resume logs every step once with the losses of the same job run
 * without a stop. */
void th_interrupt_resume(const char *name, int steps, int batch, const char *parallel, int at);

/* Runs the job `name` (th_job_file's "mlp", steps, batch 16, parallel:
 * 4 workers) with TESSERA_FAULT=fault, which ends a worker inside step k
 * (worker/dp_group.h), the job going on at 3, and fails unless tessera-run
 * exits 0 having printed `says`, metrics.jsonl logs every step once, and
 * steps 1 .. k log the losses of the same job run without the fault. The
 * faulty run may go down to 2 workers, and starts with all 4: its
 * rendezvous waits one heartbeat timeout (5 s) for the last ones. */
void th_fault_logs_every_step(const char *name, int steps, const char *parallel, const char *fault, int k,
                              const char *says);

/* Evaluates run's checkpoint of step (tessera-run --eval) and returns its
 * test accuracy (%). */
double th_eval_accuracy(const char *run, int step);

/* Fails unless the run's end after its last step is written: the step's
 * line (th_expect_steps_once), the whole-model checkpoint, and a test pass
 * over the whole test set with the checkpoint's parameters (the accuracy
 * --eval of the checkpoint gives). */
void th_expect_end_written(const char *run, int steps);

/* Starts `tessera-run --join` (output tagged tag) for job file job against
 * the running job whose run folder dir holds scheduler.addr and job.key,
 * with the arguments more after it (NULL-terminated, at most 8; NULL:
 * none). */
th_proc th_start_joiner(const char *tag, const char *job, const char *dir, const char *const *more);

/* Fails unless got[s] is want[s] within 1e-5 relative for s in [from, to]. */
void th_expect_same(const double *got, const double *want, int from, int to, const char *what);

/* Copies the run folder from to to (checkpoints and metrics). */
void th_copy_run(const char *from, const char *to);

/* Runs "tessera-run args..." (argv; tag names it) to exit 0, else fails
 * with its output; returns the output (free it). */
char *th_run_tool(const char *tag, const char *const *argv);

/* Exports checkpoint ckpt (of any strategy) with tessera-run
 * --export-onnx, and the copy of it --consolidate writes, and fails unless
 * both commands exit 0 and the two ONNX files are the same bytes; tag
 * names the files in the test folder. */
void th_expect_export_whole(const char *tag, const char *ckpt);

/* Skips the calling test, saying so, when mpirun is not installed. */
void th_need_mpirun(void);

/* Waits up to timeout_ms for an mpirun of tessera-run --mpi: skips the
 * test when tessera-run was built without MPI, else returns mpirun's
 * status (th_wait's). */
int th_mpirun_status(th_proc *p, int timeout_ms);

/* Waits up to timeout_ms for an mpirun of tessera-run --mpi: skips the
 * test when tessera-run was built without MPI, fails it with the output
 * when mpirun did not exit 0. */
void th_wait_mpirun(th_proc *p, int timeout_ms);

/* Milliseconds on a monotonic clock. */
double th_now_ms(void);

/* Reads the first line of a file into out (cap bytes); 0 on success,
 * waiting up to timeout_ms for it to appear. */
int th_read_line(const char *path, char *out, size_t cap, int timeout_ms);

#endif
