//! The output directory of `toast-cli run`, written so that it always holds
//! either one run's complete outputs or an evidently incomplete set.
//!
//! Every output is first written to a temporary name in the same directory
//! (`.NAME.tmp-PID`), flushed and synced ([`Staging::write_with`]). Only when
//! all of a run's outputs are staged does [`Staging::commit`] put them in
//! place: it moves the previous run's `stats.json` aside first, to
//! `.stats.json.previous` (a directory without `stats.json` is not a
//! complete run), then removes the files it listed as that run's own and
//! this run does not write (`mapmaker_map.png` under `--no-plot`,
//! `mapmaker_binmap.fits` with `mapmaker.write_binmap=false`, every map
//! with `mapmaker.enabled=false`), renames the staged files into place
//! with `stats.json` last, syncs the directories and removes
//! `.stats.json.previous`. A commit stopped part way (a signal, a failure,
//! SIGKILL) leaves that record, so the next commit still removes the files
//! it lists. A file of an output's name that no run listed (TOAST's own
//! `mapmaker_cov.fits`, a user's file) is never removed, nor is a file this
//! run read (its sky map, its configuration file), even where the previous
//! run listed it: the new `stats.json` tells this run's files.
//!
//! The maps (`mapmaker_*`) go to the maps directory, TOAST's
//! `mapmaker.output_dir` (relative to the output directory, or absolute);
//! the run's own files (`timing.csv`, `config.toml`, `stats.json`) stay in
//! the output directory, and `stats.json` lists every file of the run, so
//! maps a previous run left in another maps directory are not taken for
//! this run's.
//!
//! An output name taken by a directory is refused before the run's work
//! ([`check_output_names`]), and again before the commit changes anything.
//!
//! A run that fails before the commit (a write error, a full disk, an
//! injected fault) removes its temporaries and leaves the previous run's
//! outputs untouched; one that fails during the commit also removes what it
//! had already renamed, so no file of an unfinished run is left under a
//! final name. A run killed outright can leave only temporaries, never a
//! truncated file under a final name. One stopped by SIGINT, SIGTERM or
//! SIGHUP removes its temporaries as it ends, and, during the commit, the
//! files it had already renamed ([`crate::interrupt`]); after SIGKILL, the
//! next commit into the directory removes temporaries whose process is
//! gone.
//!
//! `TOAST_FAULT_INJECT=0:output NAME[:MODE]` fails (or kills) the run just
//! after output `NAME`'s temporary file is written (see `parallel.rs`).

use crate::{interrupt, parallel};
use anyhow::{anyhow, Context, Result};
use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use toast_core::Comm;

/// Every file `toast-cli run` may write, in the order of the commit
/// (`stats.json`, which marks a complete run, last). Those named
/// `mapmaker_*` are the maps (see [`is_map`]).
pub const OUTPUTS: [&str; 11] = [
    "mapmaker_hits.fits",
    "mapmaker_rcond.fits",
    "mapmaker_invcov.fits",
    "mapmaker_cov.fits",
    "mapmaker_binmap.fits",
    "mapmaker_noiseweighted_map.fits",
    "mapmaker_map.fits",
    "mapmaker_map.png",
    "timing.csv",
    "config.toml",
    "stats.json",
];

/// The file whose presence marks a complete run.
const COMPLETE: &str = "stats.json";

/// The previous run's `stats.json`, moved aside while a commit runs (see
/// [`Staging::commit`]).
const PREVIOUS: &str = ".stats.json.previous";

/// Whether output `name` is a map, written to the maps directory.
pub fn is_map(name: &str) -> bool {
    name.starts_with("mapmaker_")
}

/// Writes one whole output at the path it is given (a temporary), or says
/// why it could not; see [`Staging::write_all`].
pub type Writer<'a> = Box<dyn FnOnce(&Path) -> Result<(), String> + Send + 'a>;

/// Run `write` on temporary `tmp` and sync it; errors name `final_path`.
fn write_synced<E: Display>(
    final_path: &Path,
    tmp: &Path,
    write: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<()> {
    write(tmp).map_err(|e| anyhow!("{}: {e}", final_path.display()))?;
    sync_file(tmp).with_context(|| format!("{}: cannot sync", final_path.display()))
}

/// Outputs written to temporary files, put in place by [`Staging::commit`];
/// dropped without a commit, it removes its temporaries.
pub struct Staging {
    dir: PathBuf,
    maps_dir: PathBuf,
    comm: Arc<dyn Comm>,
    /// Files the run read (never removed by the commit).
    inputs: Vec<PathBuf>,
    /// (final name, temporary path) of each staged output.
    staged: Vec<(&'static str, PathBuf)>,
}

/// `.NAME.tmp-PID` of process `pid`.
fn temp_name(name: &str, pid: u32) -> String {
    format!(".{name}.tmp-{pid}")
}

/// The longest name this process writes in an output directory: the
/// temporary of its longest output's name.
pub fn longest_temporary() -> String {
    let name = OUTPUTS.iter().max_by_key(|n| n.len()).expect("outputs");
    temp_name(name, std::process::id())
}

/// Flush a written file's data and metadata to the disk.
fn sync_file(path: &Path) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .sync_all()
}

/// Make the directory's entries (renames, removals) durable; not every
/// platform can open a directory, so a failure to open it is not an error.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::File::open(dir) {
        Ok(d) => d.sync_all(),
        Err(_) => Ok(()),
    }
}

/// Refuse output names taken by a directory in `dir` (the run's files)
/// or `maps_dir` (the maps): a file is neither renamed over a directory
/// nor removed as a file, so the commit would fail there, after the run's
/// work and with the previous run's `stats.json` already removed. Checked
/// before the work ([`crate::cmd::run`]) and again before the commit
/// changes anything.
pub fn check_output_names(dir: &Path, maps_dir: &Path) -> Result<()> {
    for name in OUTPUTS {
        let path = if is_map(name) { maps_dir } else { dir }.join(name);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            return Err(anyhow!(
                "{}: a directory, where the run puts its output {name}: move it away",
                path.display()
            ));
        }
    }
    Ok(())
}

/// The files a run's `stats.json` (at `stats`, in output directory `dir`)
/// lists as its own, as paths to open now. The run named them under its
/// output directory as it was given (its own entry, `GIVEN/stats.json`,
/// says how): a path under that is read under `dir`, an absolute one (an
/// absolute maps directory) as it is. The error says why the file gives no
/// such list.
pub fn listed_outputs(dir: &Path, stats: &Path) -> Result<Vec<PathBuf>, String> {
    let text = std::fs::read_to_string(stats).map_err(|e| format!("cannot read: {e}"))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))?;
    let Some(outputs) = value.get("outputs").and_then(|o| o.as_array()) else {
        return Err("no list of the run's files (`outputs`)".into());
    };
    let outputs: Vec<&str> = outputs.iter().filter_map(|o| o.as_str()).collect();
    let given = outputs
        .iter()
        .map(Path::new)
        .find(|p| p.file_name().is_some_and(|n| n == COMPLETE))
        .and_then(Path::parent)
        .ok_or("`outputs` does not list stats.json itself")?;
    outputs
        .iter()
        .map(|listed| {
            let p = Path::new(listed);
            match p.strip_prefix(given) {
                Ok(rel) => Ok(dir.join(rel)),
                Err(_) if p.is_absolute() => Ok(p.to_path_buf()),
                Err(_) => Err(format!("lists {listed}, outside the run's directory")),
            }
        })
        .collect()
}

/// Remove `path` if it exists.
fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

impl Staging {
    /// Outputs for directory `dir`, the maps in `maps_dir` (both must
    /// exist), of a run that read the files `inputs`.
    pub fn new(dir: &Path, maps_dir: &Path, inputs: Vec<PathBuf>, comm: Arc<dyn Comm>) -> Self {
        Staging {
            dir: dir.to_path_buf(),
            maps_dir: maps_dir.to_path_buf(),
            comm,
            inputs,
            staged: Vec::new(),
        }
    }

    /// The directory output `name` goes to.
    fn dir_of(&self, name: &str) -> &Path {
        if is_map(name) {
            &self.maps_dir
        } else {
            &self.dir
        }
    }

    /// The final paths of the outputs staged so far.
    pub fn staged_paths(&self) -> Vec<PathBuf> {
        self.staged
            .iter()
            .map(|(n, _)| self.dir_of(n).join(n))
            .collect()
    }

    /// The list `stats.json` holds (its `outputs`, read back by
    /// [`listed_outputs`]): the outputs staged so far and `stats.json`
    /// itself, as the run names them.
    pub fn listing(&self) -> Vec<String> {
        let mut files = self.staged_paths();
        files.push(self.dir.join(COMPLETE));
        files.iter().map(|p| p.display().to_string()).collect()
    }

    /// Stage output `name` (one of [`OUTPUTS`]): `write` writes the whole
    /// file at the path it is given (a temporary), which is then synced.
    /// Errors name the output's final path.
    pub fn write_with<E: Display>(
        &mut self,
        name: &'static str,
        write: impl FnOnce(&Path) -> Result<(), E>,
    ) -> Result<()> {
        let (final_path, tmp) = self.stage(name);
        write_synced(&final_path, &tmp, write)?;
        parallel::fault_point(&*self.comm, &format!("output {name}"))
    }

    /// Stage several outputs at once: each [`Writer`] runs on a thread of
    /// its own (their encoding shares the rayon pool), so the files' writes
    /// into the page cache and their syncs overlap instead of queueing.
    /// Every writer runs to its end even when another fails; the first
    /// error, in the order given, is returned (its temporaries, like all
    /// of them, are removed when the staging is dropped). The fault points
    /// (`TOAST_FAULT_INJECT=0:output NAME`) are met in the order given,
    /// once all the files are written.
    pub fn write_all(&mut self, writers: Vec<(&'static str, Writer<'_>)>) -> Result<()> {
        // Recorded before writing: partial temporaries are removed on drop.
        let paths: Vec<(PathBuf, PathBuf)> = writers.iter().map(|(n, _)| self.stage(n)).collect();
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = writers
                .into_iter()
                .zip(&paths)
                .map(|((_, write), (final_path, tmp))| {
                    s.spawn(move || write_synced(final_path, tmp, write))
                })
                .collect();
            handles
                .into_iter()
                .zip(&paths)
                .map(|(h, (final_path, _))| {
                    h.join().unwrap_or_else(|_| {
                        Err(anyhow!("{}: its writer panicked", final_path.display()))
                    })
                })
                .collect()
        });
        for r in results {
            r?;
        }
        for (name, _) in &self.staged[self.staged.len() - paths.len()..] {
            parallel::fault_point(&*self.comm, &format!("output {name}"))?;
        }
        Ok(())
    }

    /// Record output `name` (one of [`OUTPUTS`]) as staged: its final and
    /// temporary paths.
    fn stage(&mut self, name: &'static str) -> (PathBuf, PathBuf) {
        debug_assert!(OUTPUTS.contains(&name), "{name} is not an output");
        let final_path = self.dir_of(name).join(name);
        let tmp = self.dir_of(name).join(temp_name(name, std::process::id()));
        interrupt::track(&tmp);
        self.staged.push((name, tmp.clone()));
        (final_path, tmp)
    }

    /// Stage output `name` with content `bytes`.
    pub fn write_bytes(&mut self, name: &'static str, bytes: &[u8]) -> Result<()> {
        self.write_with(name, |p| std::fs::write(p, bytes))
    }

    /// Put the staged outputs in place (see the module's description).
    pub fn commit(mut self) -> Result<()> {
        let dir = self.dir.clone();
        let maps_dir = self.maps_dir.clone();
        check_output_names(&dir, &maps_dir)?;
        let at = |name: &str| {
            if is_map(name) {
                maps_dir.join(name)
            } else {
                dir.join(name)
            }
        };
        // The previous run's own files, from its stats.json, or from the
        // record a commit stopped part way left (none where neither gives a
        // list), and this run's inputs, as canonical paths: one file may be
        // spelled two ways.
        let canonical = |p: &Path| std::fs::canonicalize(p).ok();
        let record = dir.join(PREVIOUS);
        let previous: Vec<PathBuf> = [at(COMPLETE), record.clone()]
            .iter()
            .flat_map(|stats| listed_outputs(&dir, stats).unwrap_or_default())
            .filter_map(|p| canonical(&p))
            .collect();
        let inputs: Vec<PathBuf> = self.inputs.iter().filter_map(|p| canonical(p)).collect();
        // The previous stats.json moves aside, not away: the directory is
        // no complete run from here, and a commit stopped before the end
        // leaves the list for the next one.
        if std::fs::symlink_metadata(at(COMPLETE)).is_ok() {
            std::fs::rename(at(COMPLETE), &record).with_context(|| {
                format!(
                    "{}: cannot move the previous run's output aside",
                    at(COMPLETE).display()
                )
            })?;
        }
        for name in OUTPUTS {
            let stale =
                canonical(&at(name)).is_some_and(|c| previous.contains(&c) && !inputs.contains(&c));
            if stale && !self.staged.iter().any(|(n, _)| *n == name) {
                remove_if_present(&at(name)).with_context(|| {
                    format!(
                        "{}: cannot remove the previous run's output",
                        at(name).display()
                    )
                })?;
            }
        }
        let mut order = std::mem::take(&mut self.staged);
        order.sort_by_key(|(n, _)| OUTPUTS.iter().position(|o| o == n));
        let mut renamed: Vec<PathBuf> = Vec::new();
        let mut pending = order.into_iter();
        let result = (|| -> Result<()> {
            for (name, tmp) in pending.by_ref() {
                let final_path = at(name);
                // Until the commit ends, a signal removes what was renamed
                // too, as a failure below does.
                interrupt::track(&final_path);
                let renaming = std::fs::rename(&tmp, &final_path);
                if renaming.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                    interrupt::untrack(&final_path);
                }
                interrupt::untrack(&tmp);
                if let Err(e) = renaming {
                    return Err(
                        anyhow!(e).context(format!("{}: cannot rename", final_path.display()))
                    );
                }
                renamed.push(final_path);
            }
            for d in [&dir, &maps_dir] {
                sync_dir(d).with_context(|| format!("{}: cannot sync", d.display()))?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            for (_, tmp) in pending {
                let _ = std::fs::remove_file(&tmp);
                interrupt::untrack(&tmp);
            }
            for p in renamed {
                let _ = std::fs::remove_file(&p);
                interrupt::untrack(&p);
            }
            return Err(e);
        }
        for p in &renamed {
            interrupt::untrack(p);
        }
        // Nothing of the previous run is left that this one does not list.
        let _ = remove_if_present(&record);
        remove_dead_temporaries(&dir, &OUTPUTS);
        if maps_dir != dir {
            remove_dead_temporaries(&maps_dir, &OUTPUTS);
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        for (_, tmp) in self.staged.drain(..) {
            let _ = std::fs::remove_file(&tmp);
            interrupt::untrack(&tmp);
        }
    }
}

/// The name of the file at `path` and this process's temporary for it
/// beside it (`.NAME.tmp-PID`).
fn temporary_beside(path: &Path) -> (String, PathBuf) {
    let name = path
        .file_name()
        .map_or("output".into(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(temp_name(&name, std::process::id()));
    (name, tmp)
}

/// Replace the file at `path` by `bytes` whole or not at all: written to
/// `.NAME.tmp-PID` beside it, synced, renamed into place (the temporary is
/// removed on a failure), and the temporaries of `NAME` that killed
/// processes left there removed. For single files outside a run's output
/// directory (`bench --json`).
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let (name, tmp) = temporary_beside(path);
    interrupt::track(&tmp);
    let written = std::fs::write(&tmp, bytes)
        .and_then(|()| sync_file(&tmp))
        .and_then(|()| std::fs::rename(&tmp, path))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        });
    interrupt::untrack(&tmp);
    written?;
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        remove_dead_temporaries(dir, &[name.as_str()]);
    }
    Ok(())
}

/// Whether `path`'s directory takes a temporary for it (`.NAME.tmp-PID`
/// written and removed): where [`replace_file`] could not write, this says
/// so before the work that produces the bytes.
pub fn check_replaceable(path: &Path) -> std::io::Result<()> {
    let (_, tmp) = temporary_beside(path);
    std::fs::write(&tmp, b"")?;
    let _ = std::fs::remove_file(&tmp);
    Ok(())
}

/// Remove the temporaries of outputs `names` left in `dir` by processes
/// that were killed (their process no longer exists). Where process ids
/// cannot be checked (no `/proc`), nothing is removed.
fn remove_dead_temporaries(dir: &Path, names: &[&str]) {
    let proc = Path::new("/proc");
    if !proc.join("self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(file) = file.to_str() else { continue };
        let pid = names.iter().find_map(|name| {
            file.strip_prefix(&format!(".{name}.tmp-"))
                .and_then(|pid| pid.parse::<u32>().ok())
        });
        if let Some(pid) = pid {
            if pid != std::process::id() && !proc.join(pid.to_string()).exists() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staging(dir: &Path) -> Staging {
        Staging::new(dir, dir, Vec::new(), Arc::new(toast_core::SerialComm))
    }

    /// Stage `stats.json` as `toast-cli run` writes it: with its listing.
    fn stage_stats(s: &mut Staging, tag: &str) {
        let stats = serde_json::json!({ "tag": tag, "outputs": s.listing() });
        s.write_bytes("stats.json", stats.to_string().as_bytes())
            .unwrap();
    }

    fn stats_tag(dir: &Path) -> String {
        let text = std::fs::read_to_string(dir.join("stats.json")).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        value["tag"].as_str().unwrap().to_string()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_failed_write_leaves_the_previous_run_and_no_temporary() {
        let dir = std::env::temp_dir().join(format!("toast-cli-output-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = staging(&dir);
        s.write_bytes("mapmaker_map.png", b"old png").unwrap();
        stage_stats(&mut s, "old");
        s.commit().unwrap();
        assert_eq!(names(&dir), ["mapmaker_map.png", "stats.json"]);
        // A run that fails half-way: the previous outputs stay as they were.
        let mut s = staging(&dir);
        s.write_bytes("mapmaker_hits.fits", b"new").unwrap();
        let e = s
            .write_with("mapmaker_map.fits", |p| {
                std::fs::write(p, b"trunc")?;
                Err(std::io::Error::other("disk full"))
            })
            .unwrap_err();
        assert!(
            format!("{e:#}").contains("mapmaker_map.fits: disk full"),
            "{e:#}"
        );
        drop(s);
        assert_eq!(names(&dir), ["mapmaker_map.png", "stats.json"]);
        // A complete run replaces them and drops what it does not write;
        // a dead process's temporary is removed.
        std::fs::write(dir.join(temp_name("timing.csv", u32::MAX)), b"x").unwrap();
        let mut s = staging(&dir);
        s.write_bytes("mapmaker_hits.fits", b"new").unwrap();
        stage_stats(&mut s, "new");
        s.commit().unwrap();
        assert_eq!(names(&dir), ["mapmaker_hits.fits", "stats.json"]);
        assert_eq!(stats_tag(&dir), "new");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `replace_file` puts the whole file in place, leaves no temporary,
    /// and removes the one a killed process left for the same name (only
    /// that name's: another file's temporary is not its business).
    #[test]
    fn a_replaced_file_is_whole_and_cleans_dead_temporaries() {
        let dir = std::env::temp_dir().join(format!("toast-cli-replace-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("report.json");
        std::fs::write(&path, b"old").unwrap();
        std::fs::write(dir.join(temp_name("report.json", u32::MAX)), b"x").unwrap();
        std::fs::write(dir.join(temp_name("other.json", u32::MAX)), b"x").unwrap();
        check_replaceable(&path).unwrap();
        replace_file(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(
            names(&dir),
            [temp_name("other.json", u32::MAX), "report.json".into()]
        );
        // A directory that cannot be written: refused up front, no change.
        let missing = dir.join("no-such-dir").join("r.json");
        assert!(check_replaceable(&missing).is_err());
        assert!(replace_file(&missing, b"x").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A directory under an output's name (here `timing.csv`, or the
    /// `mapmaker_map.png` a `--no-plot` run would remove) fails the commit
    /// before it changes anything: the previous run stays whole.
    #[test]
    fn a_directory_under_an_output_name_fails_before_the_commit_changes_anything() {
        let dir = std::env::temp_dir().join(format!("toast-cli-obstacle-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = staging(&dir);
        s.write_bytes("mapmaker_map.fits", b"old").unwrap();
        s.write_bytes("stats.json", b"old").unwrap();
        s.commit().unwrap();
        for obstacle in ["timing.csv", "mapmaker_map.png"] {
            std::fs::create_dir_all(dir.join(obstacle).join("x")).unwrap();
            let e = check_output_names(&dir, &dir).unwrap_err();
            assert!(
                format!("{e:#}").contains(&format!("{obstacle}: a directory")),
                "{e:#}"
            );
            let mut s = staging(&dir);
            s.write_bytes("mapmaker_map.fits", b"new").unwrap();
            s.write_bytes("timing.csv", b"new").unwrap();
            s.write_bytes("stats.json", b"new").unwrap();
            s.commit().unwrap_err();
            let mut want = vec!["mapmaker_map.fits", obstacle, "stats.json"];
            want.sort();
            assert_eq!(names(&dir), want, "{obstacle}");
            assert_eq!(std::fs::read(dir.join("stats.json")).unwrap(), b"old");
            std::fs::remove_dir_all(dir.join(obstacle)).unwrap();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn parallel_writes_stage_every_file_and_report_the_first_failure() {
        let dir = std::env::temp_dir().join(format!("toast-cli-parallel-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ok = |bytes: &'static [u8]| -> Writer<'static> {
            Box::new(move |p| std::fs::write(p, bytes).map_err(|e| e.to_string()))
        };
        let mut s = staging(&dir);
        s.write_all(vec![
            ("mapmaker_hits.fits", ok(b"h")),
            ("mapmaker_map.fits", ok(b"m")),
            ("mapmaker_map.png", ok(b"p")),
        ])
        .unwrap();
        s.write_bytes("stats.json", b"s").unwrap();
        s.commit().unwrap();
        let committed = [
            "mapmaker_hits.fits",
            "mapmaker_map.fits",
            "mapmaker_map.png",
            "stats.json",
        ];
        assert_eq!(names(&dir), committed);
        assert_eq!(std::fs::read(dir.join("mapmaker_map.fits")).unwrap(), b"m");
        // Two writers fail: the first in the given order is reported, the
        // others still ran, and dropping the staging removes every temporary.
        let fail = |why: &'static str| -> Writer<'static> {
            Box::new(move |p| {
                std::fs::write(p, b"partial").map_err(|e| e.to_string())?;
                Err(why.to_string())
            })
        };
        let mut s = staging(&dir);
        let e = s
            .write_all(vec![
                ("mapmaker_hits.fits", ok(b"h2")),
                ("mapmaker_binmap.fits", fail("disk full")),
                ("mapmaker_map.fits", fail("quota")),
            ])
            .unwrap_err();
        assert!(
            format!("{e:#}").contains("mapmaker_binmap.fits: disk full"),
            "{e:#}"
        );
        drop(s);
        assert_eq!(names(&dir), committed);
        assert_eq!(std::fs::read(dir.join("mapmaker_hits.fits")).unwrap(), b"h");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn maps_go_to_the_maps_directory_and_stale_maps_there_are_removed() {
        let dir = std::env::temp_dir().join(format!("toast-cli-maps-{}", std::process::id()));
        let maps = dir.join("maps");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&maps).unwrap();
        let mut s = Staging::new(&dir, &maps, Vec::new(), Arc::new(toast_core::SerialComm));
        s.write_bytes("mapmaker_cov.fits", b"old").unwrap();
        s.write_bytes("mapmaker_map.fits", b"old").unwrap();
        stage_stats(&mut s, "old");
        s.commit().unwrap();
        let mut s = Staging::new(&dir, &maps, Vec::new(), Arc::new(toast_core::SerialComm));
        s.write_bytes("mapmaker_map.fits", b"m").unwrap();
        s.write_bytes("stats.json", b"s").unwrap();
        assert_eq!(
            s.staged_paths(),
            [maps.join("mapmaker_map.fits"), dir.join("stats.json")]
        );
        s.commit().unwrap();
        assert_eq!(names(&maps), ["mapmaker_map.fits"]);
        assert_eq!(names(&dir), ["maps", "stats.json"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A commit stopped after it moved the previous stats.json aside (a
    /// signal, SIGKILL, a power cut) leaves its record: the next commit
    /// still removes the files that run listed, then the record.
    #[test]
    fn a_stopped_commits_record_still_names_the_previous_runs_files() {
        let dir = std::env::temp_dir().join(format!("toast-cli-stopped-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut s = staging(&dir);
        s.write_bytes("mapmaker_map.fits", b"a").unwrap();
        s.write_bytes("mapmaker_map.png", b"a").unwrap();
        stage_stats(&mut s, "a");
        s.commit().unwrap();
        // What a commit stopped after its first step leaves.
        std::fs::rename(dir.join(COMPLETE), dir.join(PREVIOUS)).unwrap();
        let mut s = staging(&dir);
        s.write_bytes("mapmaker_map.fits", b"c").unwrap();
        stage_stats(&mut s, "c");
        s.commit().unwrap();
        assert_eq!(names(&dir), ["mapmaker_map.fits", "stats.json"]);
        assert_eq!(stats_tag(&dir), "c");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The commit removes only what the previous run's stats.json listed,
    /// and never a file this run read: a directory of TOAST's outputs, or
    /// a previous run's map used as this run's sky, keeps them.
    #[test]
    fn files_no_run_listed_and_the_runs_inputs_are_never_removed() {
        let dir = std::env::temp_dir().join(format!("toast-cli-foreign-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // TOAST's outputs (no stats.json of ours): none is removed.
        for name in [
            "mapmaker_cov.fits",
            "mapmaker_rcond.fits",
            "mapmaker_map.png",
        ] {
            std::fs::write(dir.join(name), b"toast").unwrap();
        }
        let mut s = staging(&dir);
        s.write_bytes("mapmaker_map.fits", b"m1").unwrap();
        s.write_bytes("mapmaker_binmap.fits", b"b1").unwrap();
        stage_stats(&mut s, "first");
        s.commit().unwrap();
        let all = [
            "mapmaker_binmap.fits",
            "mapmaker_cov.fits",
            "mapmaker_map.fits",
            "mapmaker_map.png",
            "mapmaker_rcond.fits",
            "stats.json",
        ];
        assert_eq!(names(&dir), all);
        // A run that reads the first run's binmap (its sky map, spelled
        // through a link to the directory) and does not write one: the
        // binmap stays, the others are still not this tool's to remove.
        let link = dir.with_extension("link");
        let _ = std::fs::remove_file(&link);
        #[cfg(unix)]
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        #[cfg(not(unix))]
        let link = dir.clone();
        let input = link.join("mapmaker_binmap.fits");
        assert_ne!(input, dir.join("mapmaker_binmap.fits"));
        let mut s = Staging::new(&dir, &dir, vec![input], Arc::new(toast_core::SerialComm));
        s.write_bytes("mapmaker_map.fits", b"m2").unwrap();
        stage_stats(&mut s, "second");
        s.commit().unwrap();
        assert_eq!(names(&dir), all);
        assert_eq!(
            std::fs::read(dir.join("mapmaker_binmap.fits")).unwrap(),
            b"b1"
        );
        assert_eq!(stats_tag(&dir), "second");
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
