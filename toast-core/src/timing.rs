//! Named timers and TOAST's timing CSV.
//!
//! TOAST's timers are flat and named; hierarchy lives in the name. Its
//! function timers are called `(function) Outer.exec|Inner._exec|f`: the
//! prefix, then the call chain joined with `|`. [`Timers::enter`] and
//! [`Timers::exit`] build names the same way from a stack of frames, so
//! TOAST's plotting and merging tools (`toast_timing_plot`,
//! `toast_merge_timings`) group ours as they group theirs.
//!
//! [`write_csv`] reproduces `toast.timing.dump` exactly: Python's `csv`
//! writer with `,` as delimiter and `'` as quote character (quoting only
//! when needed), `\r\n` line ends, the header
//! `Timer,Processes,Minimum Calls,Maximum Calls,Minimum Time,Maximum Time,Mean Time,Median Time`
//! (TOAST writes the long "Minimum"/"Maximum" forms), rows sorted by name,
//! and numbers printed as Python prints them (`3`, `0.25`, `1e-05`, `2.0`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::time::Instant;
use thiserror::Error;

/// Prefix of hierarchical (function) timer names, as in TOAST.
pub const FUNCTION_PREFIX: &str = "(function) ";
/// Separator of frames in hierarchical timer names, as in TOAST.
pub const FRAME_SEPARATOR: char = '|';

/// The CSV header of TOAST's `timing.dump`.
pub const CSV_HEADER: [&str; 8] = [
    "Timer",
    "Processes",
    "Minimum Calls",
    "Maximum Calls",
    "Minimum Time",
    "Maximum Time",
    "Mean Time",
    "Median Time",
];

/// Timer misuse.
#[derive(Debug, Error)]
pub enum TimerError {
    /// `start` of a running timer.
    #[error("timer '{name}' is already running")]
    AlreadyRunning {
        /// Timer name.
        name: String,
    },
    /// `stop` of a timer that is not running.
    #[error("timer '{name}' is not running")]
    NotRunning {
        /// Timer name.
        name: String,
    },
    /// `exit` of a frame that is not the innermost one.
    #[error("cannot exit timer frame '{frame}': the innermost frame is {innermost:?}")]
    FrameMismatch {
        /// Frame asked for.
        frame: String,
        /// Innermost frame, if any.
        innermost: Option<String>,
    },
    /// Writing the CSV failed.
    #[error("cannot write timing CSV {path}: {source}")]
    Io {
        /// Output path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// One accumulating timer.
#[derive(Debug, Clone, Default)]
pub struct Timer {
    seconds: f64,
    calls: u64,
    started: Option<Instant>,
}

impl Timer {
    /// Seconds accumulated by completed start/stop pairs (and [`Timers::record`]).
    pub fn seconds(&self) -> f64 {
        self.seconds
    }

    /// Accumulated seconds plus the running interval, if any.
    pub fn seconds_now(&self) -> f64 {
        self.seconds + self.started.map_or(0.0, |t| t.elapsed().as_secs_f64())
    }

    /// Completed calls.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// Whether the timer is running.
    pub fn is_running(&self) -> bool {
        self.started.is_some()
    }
}

/// A registry of named timers, with a frame stack for hierarchical names.
#[derive(Debug, Clone, Default)]
pub struct Timers {
    timers: BTreeMap<String, Timer>,
    frames: Vec<(String, String)>,
}

impl Timers {
    /// No timers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Start `name` (creating it on first use).
    pub fn start(&mut self, name: &str) -> Result<(), TimerError> {
        let t = self.timers.entry(name.to_string()).or_default();
        if t.started.is_some() {
            return Err(TimerError::AlreadyRunning {
                name: name.to_string(),
            });
        }
        t.started = Some(Instant::now());
        Ok(())
    }

    /// Stop `name`, adding the elapsed time and one call; returns the
    /// elapsed seconds of this interval.
    pub fn stop(&mut self, name: &str) -> Result<f64, TimerError> {
        let not_running = || TimerError::NotRunning {
            name: name.to_string(),
        };
        let t = self.timers.get_mut(name).ok_or_else(not_running)?;
        let start = t.started.take().ok_or_else(not_running)?;
        let dt = start.elapsed().as_secs_f64();
        t.seconds += dt;
        t.calls += 1;
        Ok(dt)
    }

    /// Add an externally measured duration (a device kernel's own timing,
    /// say) of `calls` calls to `name`.
    pub fn record(&mut self, name: &str, seconds: f64, calls: u64) {
        let t = self.timers.entry(name.to_string()).or_default();
        t.seconds += seconds;
        t.calls += calls;
    }

    /// The hierarchical name [`Timers::enter`] would use for `frame` now:
    /// `(function) outer|...|frame`.
    pub fn path_name(&self, frame: &str) -> String {
        let mut name = String::from(FUNCTION_PREFIX);
        for (f, _) in &self.frames {
            name.push_str(f);
            name.push(FRAME_SEPARATOR);
        }
        name.push_str(frame);
        name
    }

    /// Push `frame` (e.g. `Pipeline.exec`) and start its hierarchical timer;
    /// returns the timer name.
    pub fn enter(&mut self, frame: &str) -> Result<String, TimerError> {
        let name = self.path_name(frame);
        self.start(&name)?;
        self.frames.push((frame.to_string(), name.clone()));
        Ok(name)
    }

    /// Stop the innermost frame, which must be `frame`; returns its elapsed seconds.
    pub fn exit(&mut self, frame: &str) -> Result<f64, TimerError> {
        match self.frames.last() {
            Some((f, _)) if f == frame => {
                let (_, name) = self.frames.pop().expect("checked non-empty");
                self.stop(&name)
            }
            other => Err(TimerError::FrameMismatch {
                frame: frame.to_string(),
                innermost: other.map(|(f, _)| f.clone()),
            }),
        }
    }

    /// Current frame stack, outermost first.
    pub fn frames(&self) -> impl Iterator<Item = &str> {
        self.frames.iter().map(|(f, _)| f.as_str())
    }

    /// A timer by name.
    pub fn get(&self, name: &str) -> Option<&Timer> {
        self.timers.get(name)
    }

    /// Timer names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.timers.keys().map(String::as_str)
    }

    /// Number of timers.
    pub fn len(&self) -> usize {
        self.timers.len()
    }

    /// Whether there is no timer.
    pub fn is_empty(&self) -> bool {
        self.timers.is_empty()
    }

    /// Stop every running timer and clear the frame stack.
    pub fn stop_all(&mut self) {
        for t in self.timers.values_mut() {
            if let Some(s) = t.started.take() {
                t.seconds += s.elapsed().as_secs_f64();
                t.calls += 1;
            }
        }
        self.frames.clear();
    }

    /// Add another registry's seconds and calls into this one.
    pub fn merge(&mut self, other: &Timers) {
        for (name, t) in &other.timers {
            self.record(name, t.seconds, t.calls);
        }
    }

    /// Statistics for this process alone (min = max = mean = median).
    pub fn stats(&self) -> Vec<TimerStats> {
        compute_stats(&[self])
    }

    /// The CSV text of [`write_csv`] for this process.
    pub fn to_csv(&self) -> String {
        let mut out = Vec::new();
        write_csv(&self.stats(), &mut out).expect("writing to a Vec cannot fail");
        String::from_utf8(out).expect("CSV is built from UTF-8 strings")
    }

    /// Write this process's timing CSV to `path` (the full file name; TOAST's
    /// `dump` appends `.csv` to its argument itself).
    pub fn dump(&self, path: impl AsRef<Path>) -> Result<(), TimerError> {
        let path = path.as_ref();
        let io = |source| TimerError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        write_csv(&self.stats(), &mut f).map_err(io)?;
        f.flush().map_err(io)
    }
}

/// Statistics of one timer across processes, as TOAST's `compute_stats`.
#[derive(Debug, Clone, PartialEq)]
pub struct TimerStats {
    /// Timer name.
    pub name: String,
    /// Processes that have this timer.
    pub processes: usize,
    /// Fewest calls on one process.
    pub min_calls: u64,
    /// Most calls on one process.
    pub max_calls: u64,
    /// Least seconds on one process.
    pub min_time: f64,
    /// Most seconds on one process.
    pub max_time: f64,
    /// Mean seconds over the processes that have it.
    pub mean_time: f64,
    /// Median seconds (mean of the two middle values for an even count, as numpy).
    pub median_time: f64,
}

impl Timers {
    /// The timers as bytes (name, seconds so far, calls), for gathering
    /// across processes; [`Timers::decode`] reads them back.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(self.timers.len() as u64).to_le_bytes());
        for (name, t) in &self.timers {
            out.extend_from_slice(&(name.len() as u64).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&t.seconds_now().to_le_bytes());
            out.extend_from_slice(&t.calls.to_le_bytes());
        }
        out
    }

    /// Timers from [`Timers::encode`]'s bytes (all stopped).
    pub fn decode(bytes: &[u8]) -> Result<Timers, String> {
        let mut pos = 0usize;
        let mut take = |n: usize| -> Result<&[u8], String> {
            let s = bytes
                .get(pos..pos + n)
                .ok_or_else(|| format!("encoded timers truncated at byte {pos}"))?;
            pos += n;
            Ok(s)
        };
        let word = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or([0; 8]));
        let n = word(take(8)?);
        let mut timers = Timers::new();
        for _ in 0..n {
            let len = word(take(8)?) as usize;
            let name = std::str::from_utf8(take(len)?)
                .map_err(|_| "encoded timer name is not UTF-8".to_string())?
                .to_string();
            let seconds = f64::from_bits(word(take(8)?));
            let calls = word(take(8)?);
            timers.record(&name, seconds, calls);
        }
        Ok(timers)
    }
}

/// Combine per-process registries (one element for a serial run), sorted by
/// timer name. Running timers count with their elapsed time so far.
pub fn compute_stats(per_process: &[&Timers]) -> Vec<TimerStats> {
    let mut names: Vec<&str> = per_process.iter().flat_map(|t| t.names()).collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let mut secs: Vec<f64> = Vec::new();
            let mut calls: Vec<u64> = Vec::new();
            for p in per_process {
                if let Some(t) = p.get(name) {
                    secs.push(t.seconds_now());
                    calls.push(t.calls);
                }
            }
            let n = secs.len();
            let mut sorted = secs.clone();
            sorted.sort_by(f64::total_cmp);
            let median = if n % 2 == 1 {
                sorted[n / 2]
            } else {
                (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
            };
            TimerStats {
                name: name.to_string(),
                processes: n,
                min_calls: calls.iter().copied().min().unwrap_or(0),
                max_calls: calls.iter().copied().max().unwrap_or(0),
                min_time: sorted[0],
                max_time: sorted[n - 1],
                mean_time: secs.iter().sum::<f64>() / n as f64,
                median_time: median,
            }
        })
        .collect()
}

/// Format a float as Python's `repr` does (shortest round-trip digits;
/// scientific notation below 1e-4 and from 1e16, with a two-digit signed
/// exponent; a trailing `.0` on integral values).
pub fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: `d.ddde[-]x`.
    let s = format!("{:e}", x.abs());
    let (mant, exp) = s.split_once('e').expect("LowerExp always has an exponent");
    let exp: i32 = exp.parse().expect("LowerExp exponent is an integer");
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let decpt = exp + 1;
    let mut out = String::new();
    if x < 0.0 {
        out.push('-');
    }
    if decpt > -4 && decpt <= 16 {
        if decpt <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-decpt) as usize));
            out.push_str(&digits);
        } else if decpt as usize >= digits.len() {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', decpt as usize - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..decpt as usize]);
            out.push('.');
            out.push_str(&digits[decpt as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

/// Quote a field as Python's `csv` writer does with `quotechar="'"` and
/// minimal quoting.
fn csv_field(s: &str) -> String {
    if s.contains([',', '\'', '\r', '\n']) {
        format!("'{}'", s.replace('\'', "''"))
    } else {
        s.to_string()
    }
}

/// Write TOAST's timing CSV (see the module documentation for the format).
pub fn write_csv<W: Write>(stats: &[TimerStats], w: &mut W) -> std::io::Result<()> {
    w.write_all(CSV_HEADER.join(",").as_bytes())?;
    w.write_all(b"\r\n")?;
    let mut sorted: Vec<&TimerStats> = stats.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for s in sorted {
        let row = [
            csv_field(&s.name),
            s.processes.to_string(),
            s.min_calls.to_string(),
            s.max_calls.to_string(),
            python_float_repr(s.min_time),
            python_float_repr(s.max_time),
            python_float_repr(s.mean_time),
            python_float_repr(s.median_time),
        ];
        w.write_all(row.join(",").as_bytes())?;
        w.write_all(b"\r\n")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        // (value, Python repr(value)) pairs produced by CPython.
        let cases: [(f64, &str); 26] = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-05, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789.123, "123456789.123"),
            (2.5e-310, "2.5e-310"),
            (1.5e-07, "1.5e-07"),
            (-3.25, "-3.25"),
            (1e100, "1e+100"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (0.30000000000000004, "0.30000000000000004"),
            (12345678901234567.0, "1.2345678901234568e+16"),
            (9999999999999998.0, "9999999999999998.0"),
            (0.00012345, "0.00012345"),
            (1234.5678e-9, "1.2345678e-06"),
            (42.0, "42.0"),
            (1e22, "1e+22"),
            (9.5367431640625e-07, "9.5367431640625e-07"),
            (0.009765625, "0.009765625"),
            (3e-05, "3e-05"),
            (987654321.0, "987654321.0"),
        ];
        for (v, want) in cases {
            assert_eq!(python_float_repr(v), want, "{v:e}");
        }
        assert_eq!(python_float_repr(f64::NAN), "nan");
        assert_eq!(python_float_repr(f64::NEG_INFINITY), "-inf");
        assert_eq!(python_float_repr(-1e-7), "-1e-07");
    }

    #[test]
    fn start_stop_and_errors() {
        let mut t = Timers::new();
        t.start("a").unwrap();
        assert!(t.get("a").unwrap().is_running());
        assert!(matches!(
            t.start("a"),
            Err(TimerError::AlreadyRunning { .. })
        ));
        let dt = t.stop("a").unwrap();
        assert!(dt >= 0.0);
        assert_eq!(t.get("a").unwrap().calls(), 1);
        let e = t.stop("a").unwrap_err();
        assert_eq!(e.to_string(), "timer 'a' is not running");
        assert!(matches!(
            t.stop("never"),
            Err(TimerError::NotRunning { .. })
        ));
        t.record("a", 2.0, 3);
        assert_eq!(t.get("a").unwrap().calls(), 4);
        assert!(t.get("a").unwrap().seconds() >= 2.0);
    }

    #[test]
    fn hierarchical_names_follow_toast() {
        let mut t = Timers::new();
        let outer = t.enter("Pipeline.exec").unwrap();
        assert_eq!(outer, "(function) Pipeline.exec");
        let inner = t.enter("PixelsHealpix._exec").unwrap();
        assert_eq!(inner, "(function) Pipeline.exec|PixelsHealpix._exec");
        assert_eq!(
            t.frames().collect::<Vec<_>>(),
            ["Pipeline.exec", "PixelsHealpix._exec"]
        );
        let e = t.exit("Pipeline.exec").unwrap_err();
        assert!(matches!(e, TimerError::FrameMismatch { .. }));
        t.exit("PixelsHealpix._exec").unwrap();
        t.exit("Pipeline.exec").unwrap();
        assert!(t.exit("Pipeline.exec").is_err());
        assert_eq!(t.get(&inner).unwrap().calls(), 1);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn csv_matches_toast_dump_format() {
        let mut t = Timers::new();
        t.record("zeta", 0.5, 2);
        t.record("(function) a|b", 1e-5, 1);
        t.record("alpha, with comma", 3.0, 10);
        t.record("it's", 0.1, 1);
        let csv = t.to_csv();
        let want = "Timer,Processes,Minimum Calls,Maximum Calls,Minimum Time,Maximum Time,\
                    Mean Time,Median Time\r\n\
                    (function) a|b,1,1,1,1e-05,1e-05,1e-05,1e-05\r\n\
                    'alpha, with comma',1,10,10,3.0,3.0,3.0,3.0\r\n\
                    'it''s',1,1,1,0.1,0.1,0.1,0.1\r\n\
                    zeta,1,2,2,0.5,0.5,0.5,0.5\r\n";
        assert_eq!(csv, want);
    }

    #[test]
    fn multi_process_stats() {
        let mut a = Timers::new();
        let mut b = Timers::new();
        let mut c = Timers::new();
        let mut d = Timers::new();
        a.record("x", 1.0, 1);
        b.record("x", 4.0, 3);
        c.record("x", 2.0, 2);
        d.record("x", 8.0, 5);
        c.record("only_c", 1.5, 1);
        let s = compute_stats(&[&a, &b, &c, &d]);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "only_c");
        assert_eq!(s[0].processes, 1);
        let x = &s[1];
        assert_eq!((x.processes, x.min_calls, x.max_calls), (4, 1, 5));
        assert_eq!((x.min_time, x.max_time), (1.0, 8.0));
        assert_eq!(x.mean_time, 3.75);
        assert_eq!(x.median_time, 3.0, "mean of the two middle values");
        let s3 = compute_stats(&[&a, &b, &c]);
        assert_eq!(s3[1].median_time, 2.0);
        a.merge(&b);
        assert_eq!(a.get("x").unwrap().calls(), 4);
        assert_eq!(a.get("x").unwrap().seconds(), 5.0);
    }

    #[test]
    fn stop_all_and_dump() {
        let mut t = Timers::new();
        t.enter("outer").unwrap();
        t.start("x").unwrap();
        t.stop_all();
        assert!(!t.get("x").unwrap().is_running());
        assert_eq!(t.frames().count(), 0);
        let dir = std::env::temp_dir().join(format!("toast-core-timing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("timing.csv");
        t.dump(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("Timer,Processes,Minimum Calls"));
        assert_eq!(text.lines().count(), 3);
        std::fs::remove_dir_all(&dir).unwrap();
        let e = t.dump(dir.join("missing/dir/t.csv")).unwrap_err();
        assert!(e.to_string().contains("cannot write timing CSV"));
    }
}
