//! Finding plugin files, in the order the OpenCL ICD loader uses.
//!
//! 1. paths the caller names (files or directories), [`Source::Explicit`];
//! 2. the `TOAST_BACKEND_PATH` environment variable, a list of directories
//!    or files separated as `PATH` is (`:` on Unix, `;` on Windows),
//!    [`Source::Env`];
//! 3. the directory of the running executable and its `deps/`
//!    subdirectory, so that `cargo run` and `cargo test` find the plugins
//!    cargo builds into `target/<profile>/`, [`Source::ExeDir`];
//! 4. the system directories `/usr/local/lib/toast-backends` and
//!    `<prefix>/lib/toast-backends` where `<prefix>` is the parent of the
//!    executable's directory (an installed `<prefix>/bin/toast-cli`),
//!    [`Source::System`].
//!
//! A directory contributes the files named as [`plugin_file_name`] says
//! (`libtoast_backend_<name>.so` on Linux), in file-name order; a file named
//! explicitly or in the variable is taken whatever its name. The same file
//! reached twice (same canonical path, or on Unix the same device and inode,
//! as cargo's hard-linked copies in `target/<profile>/` and its `deps/` are)
//! is kept once, at its first place. Which of two *different* files wins
//! for one backend name is decided after loading, by the registry.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

/// The environment variable holding extra plugin locations.
pub const ENV_VAR: &str = "TOAST_BACKEND_PATH";

/// The system-wide plugin directory on Unix.
pub const SYSTEM_DIR: &str = "/usr/local/lib/toast-backends";

/// File name prefix of a plugin (after the platform's `lib`).
pub const FILE_STEM_PREFIX: &str = "toast_backend_";

#[cfg(target_os = "windows")]
const LIB_PREFIX: &str = "";
#[cfg(not(target_os = "windows"))]
const LIB_PREFIX: &str = "lib";

#[cfg(target_os = "windows")]
const LIB_EXT: &str = "dll";
#[cfg(target_os = "macos")]
const LIB_EXT: &str = "dylib";
#[cfg(not(any(target_os = "windows", target_os = "macos")))]
const LIB_EXT: &str = "so";

/// The file name of the plugin for backend `name` on this platform:
/// `libtoast_backend_<name>.so`, `libtoast_backend_<name>.dylib` or
/// `toast_backend_<name>.dll`.
pub fn plugin_file_name(name: &str) -> String {
    format!("{LIB_PREFIX}{FILE_STEM_PREFIX}{name}.{LIB_EXT}")
}

/// The backend name a plugin file name announces, if it follows
/// [`plugin_file_name`]. The header's name is what counts once loaded.
pub fn backend_name_from_file(file_name: &str) -> Option<&str> {
    let rest = file_name.strip_prefix(LIB_PREFIX)?;
    let rest = rest.strip_prefix(FILE_STEM_PREFIX)?;
    let name = rest.strip_suffix(LIB_EXT)?.strip_suffix('.')?;
    (!name.is_empty()).then_some(name)
}

/// Where a plugin was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// A path the caller gave (`--backend-path`).
    Explicit,
    /// The `TOAST_BACKEND_PATH` environment variable.
    Env,
    /// The executable's directory or its `deps/`.
    ExeDir,
    /// A system directory.
    System,
    /// Registered in-process (a backend linked into the program, or a
    /// test's), not found on disk.
    Builtin,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Explicit => "explicit",
            Source::Env => "env",
            Source::ExeDir => "exe-dir",
            Source::System => "system",
            Source::Builtin => "builtin",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where to look for plugins.
///
/// [`DiscoveryOptions::default`] is the standard search: no explicit path,
/// `TOAST_BACKEND_PATH` as the process sees it, the executable's directory
/// and the system directories. Tests build an isolated search with
/// [`DiscoveryOptions::only`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryOptions {
    /// Files or directories given by the caller, searched first in order.
    pub explicit: Vec<PathBuf>,
    /// The value of `TOAST_BACKEND_PATH` (`None`: not set, or not searched).
    pub env_path: Option<OsString>,
    /// The executable's directory; it and its `deps/` are searched.
    pub exe_dir: Option<PathBuf>,
    /// System directories, searched last in order.
    pub system_dirs: Vec<PathBuf>,
    /// The options string (`"key=value;key=value"`) handed to the `init` of
    /// the backend with that name.
    pub backend_options: Vec<(String, String)>,
}

impl Default for DiscoveryOptions {
    fn default() -> Self {
        let exe_dir = std::env::current_exe()
            .ok()
            .and_then(|e| e.canonicalize().ok().or(Some(e)))
            .and_then(|e| e.parent().map(Path::to_path_buf));
        let mut system_dirs = Vec::new();
        if cfg!(unix) {
            system_dirs.push(PathBuf::from(SYSTEM_DIR));
        }
        if let Some(prefix) = exe_dir.as_deref().and_then(Path::parent) {
            system_dirs.push(prefix.join("lib").join("toast-backends"));
        }
        DiscoveryOptions {
            explicit: Vec::new(),
            env_path: std::env::var_os(ENV_VAR),
            exe_dir,
            system_dirs,
            backend_options: Vec::new(),
        }
    }
}

impl DiscoveryOptions {
    /// Search only `paths` (files or directories): no environment
    /// variable, executable directory or system directory.
    pub fn only<P: Into<PathBuf>>(paths: impl IntoIterator<Item = P>) -> Self {
        DiscoveryOptions {
            explicit: paths.into_iter().map(Into::into).collect(),
            env_path: None,
            exe_dir: None,
            system_dirs: Vec::new(),
            backend_options: Vec::new(),
        }
    }

    /// Add an explicit file or directory (searched after earlier ones).
    pub fn with_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.explicit.push(path.into());
        self
    }

    /// Use `value` as the `TOAST_BACKEND_PATH` list.
    pub fn with_env_path(mut self, value: impl Into<OsString>) -> Self {
        self.env_path = Some(value.into());
        self
    }

    /// Hand `options` to the `init` of backend `name`.
    pub fn with_backend_options(mut self, name: &str, options: &str) -> Self {
        self.backend_options
            .push((name.to_string(), options.to_string()));
        self
    }

    /// Whether backend `name`'s options string names `key`
    /// ([`option_keys`]).
    pub fn has_option(&self, name: &str, key: &str) -> bool {
        option_keys(self.options_for(name)).any(|k| k == key)
    }

    /// The options string for backend `name` (the last one given wins; `""`
    /// if none).
    pub fn options_for(&self, name: &str) -> &str {
        self.backend_options
            .iter()
            .rev()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, o)| o.as_str())
            .unwrap_or("")
    }

    /// Every location to search, in order, with its source.
    pub fn locations(&self) -> Vec<(PathBuf, Source)> {
        let mut out = Vec::new();
        for p in &self.explicit {
            out.push((p.clone(), Source::Explicit));
        }
        if let Some(v) = &self.env_path {
            for p in std::env::split_paths(v) {
                if !p.as_os_str().is_empty() {
                    out.push((p, Source::Env));
                }
            }
        }
        if let Some(d) = &self.exe_dir {
            out.push((d.clone(), Source::ExeDir));
            out.push((d.join("deps"), Source::ExeDir));
        }
        for d in &self.system_dirs {
            out.push((d.clone(), Source::System));
        }
        out
    }
}

/// A plugin file to load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The file, as reached (not canonicalised).
    pub path: PathBuf,
    pub source: Source,
    /// The search location that yielded it (the directory, or the file).
    pub location: PathBuf,
}

/// What a search location turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocationKind {
    /// A directory; this many plugin files matched the naming pattern.
    Directory { matched: usize },
    /// A file, taken as a plugin.
    File,
    /// Nothing exists there.
    Missing,
    /// It exists but could not be listed.
    Unreadable(String),
}

/// One searched location and what was found there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchLocation {
    pub path: PathBuf,
    pub source: Source,
    pub kind: LocationKind,
}

impl fmt::Display for SearchLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}", self.path.display(), self.source)?;
        match &self.kind {
            LocationKind::Directory { matched } => write!(f, ", {matched} plugin file(s))"),
            LocationKind::File => f.write_str(", file)"),
            LocationKind::Missing => f.write_str(", does not exist)"),
            LocationKind::Unreadable(e) => write!(f, ", unreadable: {e})"),
        }
    }
}

/// The outcome of a search: candidate files in search order, and the
/// locations searched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovery {
    pub candidates: Vec<Candidate>,
    pub searched: Vec<SearchLocation>,
    /// Explicitly named files (or variable entries that look like plugin
    /// files) that do not exist: reported as load failures.
    pub missing: Vec<Candidate>,
}

/// Identity of a file for de-duplication.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum FileKey {
    Canonical(PathBuf),
    #[cfg(unix)]
    Inode(u64, u64),
}

fn file_keys(path: &Path) -> Vec<FileKey> {
    let mut keys = Vec::with_capacity(2);
    let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    keys.push(FileKey::Canonical(canonical));
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let Ok(m) = std::fs::metadata(path) {
            keys.push(FileKey::Inode(m.dev(), m.ino()));
        }
    }
    keys
}

/// Whether `path` names a shared library by its extension.
fn looks_like_library(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case(LIB_EXT))
}

/// Search every location of `opts`, in order.
pub fn discover_files(opts: &DiscoveryOptions) -> Discovery {
    let mut out = Discovery::default();
    let mut seen: HashSet<FileKey> = HashSet::new();
    let mut push = |out: &mut Discovery, c: Candidate| {
        let keys = file_keys(&c.path);
        if keys.iter().any(|k| seen.contains(k)) {
            tracing::debug!(
                "plugin file {} ({}) was already found earlier; skipped",
                c.path.display(),
                c.source
            );
            return;
        }
        seen.extend(keys);
        out.candidates.push(c);
    };
    for (loc, source) in opts.locations() {
        let meta = std::fs::metadata(&loc);
        let kind = match meta {
            Err(_) => {
                // A missing explicit path, or a missing variable entry that
                // names a library file, was meant as a plugin: report it. A
                // missing directory is only noted.
                if source == Source::Explicit || (source == Source::Env && looks_like_library(&loc))
                {
                    out.missing.push(Candidate {
                        path: loc.clone(),
                        source,
                        location: loc.clone(),
                    });
                }
                LocationKind::Missing
            }
            Ok(m) if m.is_file() => {
                push(
                    &mut out,
                    Candidate {
                        path: loc.clone(),
                        source,
                        location: loc.clone(),
                    },
                );
                LocationKind::File
            }
            Ok(_) => match std::fs::read_dir(&loc) {
                Err(e) => LocationKind::Unreadable(e.to_string()),
                Ok(rd) => {
                    let mut files: Vec<PathBuf> = rd
                        .filter_map(Result::ok)
                        .filter(|e| {
                            e.file_name()
                                .to_str()
                                .and_then(backend_name_from_file)
                                .is_some()
                        })
                        .map(|e| e.path())
                        .filter(|p| p.is_file())
                        .collect();
                    files.sort();
                    let matched = files.len();
                    for f in files {
                        push(
                            &mut out,
                            Candidate {
                                path: f,
                                source,
                                location: loc.clone(),
                            },
                        );
                    }
                    LocationKind::Directory { matched }
                }
            },
        };
        // A directory the user named that gives no plugin was meant to
        // give one: say so (the variable's and the standard directories
        // often hold none, and are only listed by `toast-cli backends`).
        if source == Source::Explicit {
            match &kind {
                LocationKind::Directory { matched: 0 } => tracing::warn!(
                    "backend path {}: a directory with no plugin file in it (files named {}); \
                     nothing was loaded from it",
                    loc.display(),
                    plugin_file_name("NAME")
                ),
                LocationKind::Unreadable(e) => {
                    tracing::warn!(
                        "backend path {}: a directory that cannot be read: {e}",
                        loc.display()
                    )
                }
                _ => {}
            }
        }
        out.searched.push(SearchLocation {
            path: loc,
            source,
            kind,
        });
    }
    out
}

/// The keys of a plugin options string `KEY=VALUE[;KEY=VALUE]`, in order
/// (a bare `KEY` counts; empty items are skipped), as the plugins split it.
pub fn option_keys(options: &str) -> impl Iterator<Item = &str> {
    options
        .split(';')
        .map(|item| item.split_once('=').map_or(item, |(k, _)| k).trim())
        .filter(|k| !k.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "toast-accel-discovery-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn touch(p: &Path) {
        std::fs::write(p, b"not a library").unwrap();
    }

    #[test]
    fn file_names_round_trip() {
        let f = plugin_file_name("cuda");
        assert_eq!(backend_name_from_file(&f), Some("cuda"));
        assert_eq!(backend_name_from_file(&plugin_file_name("")), None);
        assert_eq!(backend_name_from_file("libfoo.so"), None);
        assert_eq!(
            backend_name_from_file("libtoast_backend_cpu-1234.rlib"),
            None
        );
        #[cfg(target_os = "linux")]
        assert_eq!(f, "libtoast_backend_cuda.so");
    }

    #[test]
    fn order_is_explicit_env_exe_system() {
        let opts = DiscoveryOptions {
            explicit: vec!["/x/a".into(), "/x/b".into()],
            env_path: Some(std::env::join_paths(["/e/1", "", "/e/2"]).unwrap()),
            exe_dir: Some("/bin/here".into()),
            system_dirs: vec!["/sys/one".into()],
            backend_options: vec![],
        };
        let locs = opts.locations();
        let want: Vec<(PathBuf, Source)> = vec![
            ("/x/a".into(), Source::Explicit),
            ("/x/b".into(), Source::Explicit),
            ("/e/1".into(), Source::Env),
            ("/e/2".into(), Source::Env),
            ("/bin/here".into(), Source::ExeDir),
            ("/bin/here/deps".into(), Source::ExeDir),
            ("/sys/one".into(), Source::System),
        ];
        assert_eq!(locs, want);
    }

    #[test]
    fn default_searches_exe_dir_and_prefix_lib() {
        let opts = DiscoveryOptions::default();
        let exe = std::env::current_exe().unwrap().canonicalize().unwrap();
        let dir = exe.parent().unwrap();
        assert_eq!(opts.exe_dir.as_deref(), Some(dir));
        assert!(opts
            .system_dirs
            .contains(&dir.parent().unwrap().join("lib").join("toast-backends")));
        #[cfg(unix)]
        assert_eq!(opts.system_dirs[0], PathBuf::from(SYSTEM_DIR));
    }

    #[test]
    fn scans_directories_dedups_and_records_sources() {
        let d1 = scratch("scan1");
        let d2 = scratch("scan2");
        touch(&d1.join(plugin_file_name("b")));
        touch(&d1.join(plugin_file_name("a")));
        touch(&d1.join("libunrelated.so"));
        touch(&d2.join(plugin_file_name("a")));
        let explicit_file = d2.join("custom-name.bin");
        touch(&explicit_file);
        let opts = DiscoveryOptions::only([d1.clone(), explicit_file.clone()])
            .with_env_path(std::env::join_paths([d1.clone(), d2.clone()]).unwrap())
            .with_path(d2.join("absent.so"));
        let found = discover_files(&opts);
        let got: Vec<(PathBuf, Source)> = found
            .candidates
            .iter()
            .map(|c| (c.path.clone(), c.source))
            .collect();
        assert_eq!(
            got,
            vec![
                (d1.join(plugin_file_name("a")), Source::Explicit),
                (d1.join(plugin_file_name("b")), Source::Explicit),
                (explicit_file.clone(), Source::Explicit),
                // d1 again through the variable: already seen, skipped.
                (d2.join(plugin_file_name("a")), Source::Env),
            ]
        );
        assert_eq!(found.missing.len(), 1);
        assert_eq!(found.missing[0].path, d2.join("absent.so"));
        assert_eq!(
            found.searched[0].kind,
            LocationKind::Directory { matched: 2 }
        );
        assert_eq!(found.searched[1].kind, LocationKind::File);
        assert_eq!(found.searched[2].kind, LocationKind::Missing);
        assert_eq!(found.searched[3].source, Source::Env);
    }

    #[cfg(unix)]
    #[test]
    fn hard_links_and_symlinks_are_one_file() {
        let d = scratch("links");
        let deps = d.join("deps");
        std::fs::create_dir_all(&deps).unwrap();
        let real = deps.join(plugin_file_name("x"));
        touch(&real);
        std::fs::hard_link(&real, d.join(plugin_file_name("x"))).unwrap();
        let other = scratch("links-other");
        std::os::unix::fs::symlink(&real, other.join(plugin_file_name("x"))).unwrap();
        let opts = DiscoveryOptions {
            exe_dir: Some(d.clone()),
            ..DiscoveryOptions::only([other.clone()])
        };
        let found = discover_files(&opts);
        assert_eq!(found.candidates.len(), 1, "{:?}", found.candidates);
        assert_eq!(found.candidates[0].source, Source::Explicit);
    }

    #[test]
    fn missing_env_directory_is_only_noted() {
        let opts = DiscoveryOptions::only(Vec::<PathBuf>::new())
            .with_env_path("/definitely/not/here/toast");
        let found = discover_files(&opts);
        assert!(found.candidates.is_empty());
        assert!(found.missing.is_empty());
        assert_eq!(found.searched[0].kind, LocationKind::Missing);
    }

    #[test]
    fn options_for_is_case_insensitive_last_wins() {
        let o = DiscoveryOptions::only(Vec::<PathBuf>::new())
            .with_backend_options("cuda", "device=0")
            .with_backend_options("CUDA", "device=1");
        assert_eq!(o.options_for("cuda"), "device=1");
        assert_eq!(o.options_for("cpu"), "");
    }
}
