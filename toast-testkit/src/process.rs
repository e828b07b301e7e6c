//! Running the project's binaries from tests: scratch directories, the
//! combined output of a run, and runs with a deadline (a process still
//! running after it is a hang, which fails the test instead of blocking
//! the suite), with the settings `mpirun` needs as root on a small machine.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A fresh, empty directory under the system's temporary directory, named
/// after the test binary's `prefix`, this process and `name`.
pub fn scratch(prefix: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("{prefix}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d)
        .unwrap_or_else(|e| panic!("cannot create scratch directory {}: {e}", d.display()));
    d
}

/// Standard output followed by standard error, as text.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

/// Where a process's standard output goes.
#[derive(Debug)]
pub enum StdoutTo {
    /// A pipe read into [`Output::stdout`].
    Captured,
    /// This file, opened for writing (`/dev/full`: every write fails with
    /// `ENOSPC`); nothing is captured.
    File(PathBuf),
    /// A pipe whose reading end is closed before the process starts: its
    /// first write gets `EPIPE` (or SIGPIPE); nothing is captured.
    ClosedPipe,
}

impl StdoutTo {
    fn stdio(&self) -> Stdio {
        match self {
            StdoutTo::Captured => Stdio::piped(),
            StdoutTo::File(p) => Stdio::from(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(p)
                    .unwrap_or_else(|e| panic!("{}: {e}", p.display())),
            ),
            StdoutTo::ClosedPipe => {
                use std::os::fd::FromRawFd;
                let mut fds = [0i32; 2];
                // SAFETY: `pipe` writes two new descriptors into the array
                // it is given, which has room for two.
                let rc = unsafe { libc::pipe(fds.as_mut_ptr()) };
                assert_eq!(rc, 0, "pipe: {}", std::io::Error::last_os_error());
                // SAFETY: both descriptors were just made by `pipe` and are
                // owned by nothing else; each is owned once from here on
                // (the reading end is closed at the end of this statement).
                let (read, write) = unsafe {
                    (
                        std::fs::File::from_raw_fd(fds[0]),
                        std::fs::File::from_raw_fd(fds[1]),
                    )
                };
                drop(read);
                Stdio::from(write)
            }
        }
    }
}

/// Run `cmd` to completion with its output captured, or fail the test when
/// it outlives `limit`: the process gets SIGTERM (which `mpirun` passes on
/// to its ranks), then SIGKILL three seconds later. Both pipes are read
/// while waiting, so a full pipe never blocks the process. After a hang
/// the readers are not joined: an orphaned MPI rank may still hold the
/// pipes.
pub fn run_with_deadline(cmd: Command, limit: Duration, what: &str) -> Output {
    run_to(cmd, &StdoutTo::Captured, limit, what)
}

/// [`run_with_deadline`] with standard output going to `stdout`.
pub fn run_to(cmd: Command, stdout: &StdoutTo, limit: Duration, what: &str) -> Output {
    run_polling(
        cmd,
        stdout,
        limit,
        what,
        Duration::from_millis(20),
        &mut |_| {},
    )
}

/// The peaks of a process's resident memory, sampled from
/// `/proc/PID/status` while it runs ([`run_sampling_memory`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SampledMemory {
    /// The largest `VmRSS` seen, in bytes.
    pub rss: u64,
    /// The largest `RssAnon + RssFile` seen, in bytes: the resident memory
    /// outside shared memory, which leaves out the emulated device's
    /// (`toast_gpu_emu::heap` maps it shared).
    pub outside_shmem: u64,
    /// Samples read.
    pub samples: u64,
}

impl SampledMemory {
    fn sample(&mut self, pid: u32) {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            return;
        };
        let kb = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        };
        let (Some(rss), Some(anon), Some(file)) = (kb("VmRSS:"), kb("RssAnon:"), kb("RssFile:"))
        else {
            return; // exited between the poll and the read
        };
        self.rss = self.rss.max(rss * 1024);
        self.outside_shmem = self.outside_shmem.max((anon + file) * 1024);
        self.samples += 1;
    }
}

/// [`run_with_deadline`], reading the process's resident memory every 5
/// ms while it runs (Linux only: no samples elsewhere). A peak held for
/// less than that may be missed: the sampled peaks are lower bounds.
pub fn run_sampling_memory(cmd: Command, limit: Duration, what: &str) -> (Output, SampledMemory) {
    let mut peaks = SampledMemory::default();
    let out = run_polling(
        cmd,
        &StdoutTo::Captured,
        limit,
        what,
        Duration::from_millis(5),
        &mut |pid| peaks.sample(pid),
    );
    (out, peaks)
}

/// Run `cmd`, calling `on_poll` with its process id every `poll` while it
/// runs (see [`run_with_deadline`]).
fn run_polling(
    mut cmd: Command,
    stdout: &StdoutTo,
    limit: Duration,
    what: &str,
    poll: Duration,
    on_poll: &mut dyn FnMut(u32),
) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(stdout.stdio())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let start = Instant::now();
    let status = loop {
        on_poll(child.id());
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if start.elapsed() > limit {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            std::thread::sleep(Duration::from_secs(3));
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: hung (still running after {limit:?}; killed)");
        }
        std::thread::sleep(poll);
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// One MPI job at a time: Open MPI 4.1's `mpirun`s started at the same
/// moment race to create their session directory (`/tmp/ompi.HOST.UID`)
/// and the loser fails in `orte_init` ("A call to mkdir was unable to
/// create the desired directory ... File exists").
static ONE_MPI_JOB_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Hold this while an MPI job runs: Open MPI's `mpirun`s started at the same
/// moment race on their session directory.
pub fn one_mpi_job_at_a_time() -> MutexGuard<'static, ()> {
    ONE_MPI_JOB_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `mpirun --oversubscribe -n N`, allowed to run as root (CI's user), with
/// ranks that yield their core while waiting in a collective (there may be
/// more ranks than cores).
pub fn mpirun(n: usize) -> Command {
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "-n", &n.to_string()])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env("OMPI_MCA_mpi_yield_when_idle", "1");
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_captured_and_a_hang_is_a_failure() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        let o = run_with_deadline(c, Duration::from_secs(30), "sh");
        assert_eq!(o.status.code(), Some(3));
        assert_eq!(text(&o), "out\nerr\n");
        let hang = std::panic::catch_unwind(|| {
            let mut c = Command::new("sleep");
            c.arg("30");
            run_with_deadline(c, Duration::from_millis(200), "sleep")
        });
        let msg = hang.expect_err("a hang must fail");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("sleep: hung"), "{msg}");
    }

    #[test]
    fn sampled_memory_sees_a_process_s_own_pages() {
        // A shell holding a 40 MB string for a moment.
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "x=$(head -c 40000000 /dev/zero | tr '\\0' a); sleep 0.5; echo ${#x}",
        ]);
        let (o, peaks) = run_sampling_memory(c, Duration::from_secs(30), "sh");
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(text(&o).trim(), "40000000");
        assert!(peaks.samples > 0, "{peaks:?}");
        assert!(peaks.outside_shmem >= 40_000_000, "{peaks:?}");
        assert!(peaks.rss >= peaks.outside_shmem, "{peaks:?}");
    }

    #[test]
    fn scratch_is_fresh() {
        let d = scratch("testkit", "fresh");
        std::fs::write(d.join("x"), b"1").unwrap();
        let d2 = scratch("testkit", "fresh");
        assert_eq!(d, d2);
        assert!(!d2.join("x").exists());
        let _ = std::fs::remove_dir_all(&d2);
    }
}
