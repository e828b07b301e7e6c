//! Standard output and standard error, written without panics.
//!
//! `println!` panics when standard output cannot be written (`toast-cli run
//! --dry-run > /dev/full`), and `eprintln!` when standard error cannot. Every
//! line toast-cli prints goes through this module instead:
//!
//! * [`outln!`](crate::outln) and [`Stdout`] write to standard output and
//!   return an error, a [`StdoutError`] inside the `io::Error` (its kind
//!   kept), which `main` turns into `toast-cli: cannot write to standard
//!   output: ...` and exit status 2 ([`stdout_failure`]); a closed pipe
//!   (`EPIPE`, where SIGPIPE does not end the process first) is a quiet exit;
//! * [`errln!`](crate::errln) writes one whole line to standard error and
//!   ignores failures: it is where errors are reported, there is nowhere
//!   left to report its own;
//! * the log ([`LogStderr`], `tracing`'s writer) likewise: a log line that
//!   cannot be written is dropped and the run goes on (`tracing-subscriber`
//!   reports a failed write with `eprintln!`, which panics on the same
//!   failed standard error).

use std::io::{self, Write};

/// Standard output failed: the wrapped error from the write or flush.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to standard output: {0}")]
pub struct StdoutError(#[source] pub io::Error);

/// Standard output as an [`io::Write`] whose errors carry a
/// [`StdoutError`] (so that `main` can tell them from a file's).
#[derive(Debug, Clone, Copy, Default)]
pub struct Stdout;

/// `e` as an error of standard output, of the same kind.
pub fn stdout_error(e: io::Error) -> io::Error {
    io::Error::new(e.kind(), StdoutError(e))
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        io::stdout().write(buf).map_err(stdout_error)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        io::stdout().lock().write_all(buf).map_err(stdout_error)
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stdout().flush().map_err(stdout_error)
    }
}

/// `writeln!` to standard output: `io::Result<()>`, never a panic.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        ::std::io::Write::write_all(
            &mut $crate::console::Stdout,
            (format!($($arg)*) + "\n").as_bytes(),
        )
    };
}

/// `eprintln!` without the panic: the line is written in one piece (so that
/// lines of MPI ranks do not interleave) and a failure is ignored.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::console::stderr(&(format!($($arg)*) + "\n"))
    };
}

/// Standard error for the log: each event in one piece, and a failure to
/// write it ignored (reported as written), as [`errln!`](crate::errln)
/// ignores one.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogStderr;

impl Write for LogStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = io::stderr().lock().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}

/// Write `text` on standard error in one piece; failures are ignored.
/// `eprintln!` writes its arguments one by one (stderr is unbuffered), and
/// under `mpirun` the pieces of a rank's line can then come out with other
/// output between them (seen: Open MPI's `MPI_ABORT was invoked` notice
/// inside `rank 1 of 2`).
pub fn stderr(text: &str) {
    let _ = io::stderr().lock().write_all(text.as_bytes());
}

/// The failure of standard output somewhere in `e`'s chain, if any.
pub fn stdout_failure(e: &anyhow::Error) -> Option<&io::Error> {
    e.chain().find_map(|cause| {
        let io = cause.downcast_ref::<io::Error>()?;
        io.get_ref()?.downcast_ref::<StdoutError>().map(|s| &s.0)
    })
}

/// Exit status of a run whose standard output was closed (`EPIPE`): what a
/// shell reports for a process ended by SIGPIPE, 128 + 13.
pub const EXIT_CLOSED_STDOUT: u8 = 141;

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn a_stdout_failure_is_found_in_the_chain_and_a_file_error_is_not() {
        let full = stdout_error(io::Error::from_raw_os_error(28));
        let e = anyhow::Error::from(full).context("printing the plan");
        let found = stdout_failure(&e).expect("a stdout failure");
        assert_eq!(found.raw_os_error(), Some(28));
        assert_eq!(
            crate::error_chain(&e),
            format!(
                "printing the plan: cannot write to standard output: {}",
                io::Error::from_raw_os_error(28)
            )
        );
        let pipe = anyhow::Error::from(stdout_error(io::ErrorKind::BrokenPipe.into()));
        assert_eq!(
            stdout_failure(&pipe).map(io::Error::kind),
            Some(io::ErrorKind::BrokenPipe)
        );
        let file: anyhow::Result<()> = Err(io::Error::from_raw_os_error(28)).context("map.fits");
        assert!(stdout_failure(&file.unwrap_err()).is_none());
    }
}
