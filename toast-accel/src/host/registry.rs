//! The set of backends a run can use.
//!
//! [`Registry::discover`] loads every file discovery finds. A file that
//! fails to load is recorded with its [`LoadError`] and skipped; nothing is
//! fatal until a backend is asked for by name ([`Registry::get`]). When two
//! different files carry the same backend name, the first in search order
//! wins and the other is recorded as [`Shadowed`].
//!
//! A backend is initialised lazily, on the first [`Registry::get`] or
//! [`PluginEntry::backend`] call for it, so that a run asking only for `cpu`
//! does not pay for starting a GPU runtime. [`Registry::init_all`] does it
//! eagerly (the `backends` command uses it to show every backend's status).
//! An initialisation that fails (no device, no driver) is remembered with its
//! reason and reported as [`AccelError::Unavailable`].

use super::backend::{Backend, Plugin};
use super::discovery::{
    backend_name_from_file, discover_files, DiscoveryOptions, LocationKind, SearchLocation, Source,
};
use super::error::{AccelError, LoadError};
use crate::abi::EntryFn;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// A loaded plugin and, once initialised, its backend.
#[derive(Debug)]
pub struct PluginEntry {
    plugin: Arc<Plugin>,
    source: Source,
    location: PathBuf,
    options: String,
    /// The backend, or why not: the error and its reason as listed.
    state: OnceLock<Result<Arc<Backend>, (AccelError, String)>>,
}

impl PluginEntry {
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }
    /// The backend name from the plugin header.
    pub fn name(&self) -> &str {
        &self.plugin.name
    }
    /// The plugin file.
    pub fn path(&self) -> &Path {
        &self.plugin.path
    }
    /// Where the plugin was found.
    pub fn source(&self) -> Source {
        self.source
    }
    /// The search location (directory or file) that yielded the plugin.
    pub fn location(&self) -> &Path {
        &self.location
    }
    /// The options string handed to the plugin's `init`.
    pub fn options(&self) -> &str {
        &self.options
    }
    /// Whether `init` has been called (successfully or not).
    pub fn is_initialised(&self) -> bool {
        self.state.get().is_some()
    }

    /// The initialised backend, or why it is unavailable. Initialises the
    /// backend on the first call.
    pub fn backend(&self) -> Result<&Arc<Backend>, &str> {
        self.state().as_ref().map_err(|(_, reason)| reason.as_str())
    }

    /// The backend or its error and reason, initialising it on first use.
    fn state(&self) -> &Result<Arc<Backend>, (AccelError, String)> {
        self.state
            .get_or_init(|| match self.plugin.init(&self.options) {
                Ok(b) => {
                    tracing::debug!(
                        "backend `{}` initialised from {}",
                        self.plugin.name,
                        self.plugin.path.display()
                    );
                    Ok(Arc::new(b))
                }
                Err(AccelError::Unavailable { backend, reason }) => {
                    tracing::debug!("backend `{}` is unavailable: {reason}", self.plugin.name);
                    let reason = if reason.is_empty() {
                        "the plugin gave no reason".to_string()
                    } else {
                        reason
                    };
                    Err((
                        AccelError::Unavailable {
                            backend,
                            reason: reason.clone(),
                        },
                        reason,
                    ))
                }
                Err(AccelError::InitFailed {
                    backend,
                    kind,
                    message,
                }) => {
                    let reason = format!("init failed ({kind}): {message}");
                    Err((
                        AccelError::InitFailed {
                            backend,
                            kind,
                            message,
                        },
                        reason,
                    ))
                }
                Err(other) => {
                    let reason = other.to_string();
                    Err((other, reason))
                }
            })
    }

    /// Like [`PluginEntry::backend`], with the typed error: `Unavailable`
    /// when the hardware or library is absent, `InitFailed` when `init`
    /// refused for another reason (such as a bad option).
    pub fn backend_or_error(&self) -> Result<&Arc<Backend>, AccelError> {
        self.state().as_ref().map_err(|(e, _)| e.clone())
    }
}

/// A plugin file that could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadFailure {
    pub path: PathBuf,
    pub source: Source,
    pub error: LoadError,
}

/// A plugin that loaded but lost its name to one found earlier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shadowed {
    pub name: String,
    pub version: String,
    pub path: PathBuf,
    pub source: Source,
    /// The file that provides the backend instead.
    pub winner: PathBuf,
    pub winner_source: Source,
}

/// Every backend found, every file that failed, and where the search went.
#[derive(Debug, Default)]
pub struct Registry {
    entries: Vec<PluginEntry>,
    failures: Vec<LoadFailure>,
    shadowed: Vec<Shadowed>,
    searched: Vec<SearchLocation>,
}

impl Registry {
    /// An empty registry (add backends with [`Registry::register`]).
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Search as `opts` says and load every plugin file found. Never fails:
    /// failures are recorded in [`Registry::failures`].
    pub fn discover(opts: &DiscoveryOptions) -> Registry {
        let found = discover_files(opts);
        let mut reg = Registry {
            searched: found.searched,
            ..Registry::default()
        };
        for m in found.missing {
            reg.record_failure(m.source, LoadError::Missing { path: m.path });
        }
        for c in found.candidates {
            match Plugin::load(&c.path) {
                Ok(p) => {
                    let options = opts.options_for(&p.name).to_string();
                    if let Some(hint) = c
                        .path
                        .file_name()
                        .and_then(|f| f.to_str())
                        .and_then(backend_name_from_file)
                    {
                        if !hint.eq_ignore_ascii_case(&p.name) {
                            tracing::debug!(
                                "plugin file {} is named for `{hint}` but its header says `{}`",
                                c.path.display(),
                                p.name
                            );
                        }
                    }
                    reg.insert(p, c.source, c.location, options);
                }
                Err(e) => reg.record_failure(c.source, e),
            }
        }
        reg
    }

    fn record_failure(&mut self, source: Source, error: LoadError) {
        // A file the user named is worth a warning; a stale file lying in a
        // searched directory is not.
        if matches!(source, Source::Explicit | Source::Env) {
            tracing::warn!("skipping backend plugin: {error}");
        } else {
            tracing::debug!("skipping backend plugin: {error}");
        }
        self.failures.push(LoadFailure {
            path: error.path().to_path_buf(),
            source,
            error,
        });
    }

    /// Add a loaded plugin. Returns false (and records it as shadowed) when a
    /// backend of that name is already registered.
    fn insert(
        &mut self,
        plugin: Plugin,
        source: Source,
        location: PathBuf,
        options: String,
    ) -> bool {
        if let Some(winner) = self.entry(&plugin.name) {
            tracing::debug!(
                "backend `{}` in {} is shadowed by {}",
                plugin.name,
                plugin.path.display(),
                winner.path().display()
            );
            self.shadowed.push(Shadowed {
                name: plugin.name.clone(),
                version: plugin.version.clone(),
                path: plugin.path.clone(),
                source,
                winner: winner.path().to_path_buf(),
                winner_source: winner.source(),
            });
            return false;
        }
        self.entries.push(PluginEntry {
            plugin: Arc::new(plugin),
            source,
            location,
            options,
            state: OnceLock::new(),
        });
        true
    }

    /// Add a plugin made in-process (a statically linked backend, or a test
    /// double), after those already present. `options` goes to its `init`.
    /// Returns false, recording it as shadowed, when its name is taken.
    pub fn register(&mut self, plugin: Plugin, source: Source, options: &str) -> bool {
        let location = plugin.path.clone();
        self.insert(plugin, source, location, options.to_string())
    }

    /// Check and add a backend whose entry function is linked into the
    /// program, as [`Source::Builtin`]; `label` stands for its file path in
    /// listings and errors. A header that fails the checks is recorded as a
    /// failure and returned.
    ///
    /// # Safety
    /// As [`Plugin::from_entry`].
    pub unsafe fn register_entry(
        &mut self,
        entry: EntryFn,
        label: &str,
        options: &str,
    ) -> Result<bool, LoadError> {
        // SAFETY: forwarded to the caller.
        match unsafe { Plugin::from_entry(entry, Path::new(label)) } {
            Ok(p) => Ok(self.register(p, Source::Builtin, options)),
            Err(e) => {
                self.record_failure(Source::Builtin, e.clone());
                Err(e)
            }
        }
    }

    /// The plugins, in search order (one per backend name).
    pub fn entries(&self) -> &[PluginEntry] {
        &self.entries
    }
    /// Files that could not be loaded, with why.
    pub fn failures(&self) -> &[LoadFailure] {
        &self.failures
    }
    /// Plugins that lost their name to an earlier one.
    pub fn shadowed(&self) -> &[Shadowed] {
        &self.shadowed
    }
    /// Every location searched, in order.
    pub fn searched(&self) -> &[SearchLocation] {
        &self.searched
    }
    /// Backend names, in search order.
    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(PluginEntry::name).collect()
    }

    /// The entry of backend `name` (ASCII case-insensitive), loaded but not
    /// necessarily initialised.
    pub fn entry(&self, name: &str) -> Option<&PluginEntry> {
        self.entries
            .iter()
            .find(|e| e.name().eq_ignore_ascii_case(name))
    }

    /// Initialise every backend now (their status is then known).
    pub fn init_all(&self) {
        for e in &self.entries {
            let _ = e.backend();
        }
    }

    /// The backend called `name`, initialised.
    ///
    /// Errors: [`AccelError::NotFound`], listing where the search went and
    /// the files named for `name` that failed to load; or
    /// [`AccelError::Unavailable`] with the plugin's reason.
    pub fn get(&self, name: &str) -> Result<Arc<Backend>, AccelError> {
        match self.entry(name) {
            Some(e) => e.backend_or_error().cloned(),
            None => Err(AccelError::NotFound {
                name: name.to_string(),
                detail: self.not_found_detail(name),
            }),
        }
    }

    /// Whether a load failure is about a file meant to provide `name`.
    fn failure_matches(f: &LoadFailure, name: &str) -> bool {
        let Some(file) = f.path.file_name().and_then(|s| s.to_str()) else {
            return false;
        };
        if backend_name_from_file(file).is_some_and(|n| n.eq_ignore_ascii_case(name)) {
            return true;
        }
        f.path
            .file_stem()
            .and_then(|s| s.to_str())
            .is_some_and(|s| s.eq_ignore_ascii_case(name))
    }

    fn not_found_detail(&self, name: &str) -> String {
        let mut d = String::new();
        let matching: Vec<&LoadFailure> = self
            .failures
            .iter()
            .filter(|f| Self::failure_matches(f, name))
            .collect();
        for f in &matching {
            let _ = write!(
                d,
                "; {} ({}) failed to load: {}",
                f.path.display(),
                f.source,
                f.error
            );
        }
        if self.entries.is_empty() {
            d.push_str("; no backend was found at all");
        } else {
            let _ = write!(d, "; backends found: {}", self.names().join(", "));
        }
        if self.searched.is_empty() {
            d.push_str("; no location was searched");
        } else {
            d.push_str("; searched: ");
            let locs: Vec<String> = self.searched.iter().map(|l| l.to_string()).collect();
            d.push_str(&locs.join(", "));
        }
        let others = self.failures.len() - matching.len();
        if others > 0 {
            let _ = write!(
                d,
                "; {others} other plugin file(s) failed to load (`toast-cli backends` lists them)"
            );
        }
        if !self
            .searched
            .iter()
            .any(|l| matches!(l.kind, LocationKind::Directory { .. } | LocationKind::File))
        {
            let _ = write!(
                d,
                "; set {} or pass --backend-path to point at {}",
                super::discovery::ENV_VAR,
                super::discovery::plugin_file_name(name)
            );
        }
        d
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::abi::{self, BackendTable, NoiseWeightArgs, ScanMapArgs, Status};
    use std::ffi::{c_char, c_void};

    unsafe extern "C" fn init_ok(_h: *const abi::HostApi, ctx: *mut *mut c_void) -> Status {
        // SAFETY: the host passes a valid out pointer.
        unsafe { *ctx = std::ptr::null_mut() };
        abi::OK
    }
    unsafe extern "C" fn init_down(_h: *const abi::HostApi, _ctx: *mut *mut c_void) -> Status {
        abi::ERR_UNAVAILABLE
    }
    unsafe extern "C" fn last_error_down() -> *const c_char {
        c"no device here".as_ptr()
    }
    unsafe extern "C" fn last_error_none() -> *const c_char {
        c"".as_ptr()
    }
    unsafe extern "C" fn nw(_c: *mut c_void, _a: *const NoiseWeightArgs) -> Status {
        abi::OK
    }
    unsafe extern "C" fn sm(_c: *mut c_void, _a: *const ScanMapArgs) -> Status {
        abi::OK
    }

    /// A test double: backend `name`, available or not, with the
    /// noise_weight and/or scan_map kernels.
    pub(crate) fn fake(name: &str, available: bool, noise_weight: bool, scan_map: bool) -> Plugin {
        Plugin {
            path: PathBuf::from(format!("<test:{name}>")),
            name: name.to_string(),
            version: "0.0.1".into(),
            description: format!("test double {name}"),
            abi_major: abi::ABI_MAJOR,
            abi_minor: abi::ABI_MINOR,
            flags: abi::FLAG_HOST_ADDRESSABLE,
            table: BackendTable {
                init: Some(if available { init_ok } else { init_down }),
                last_error: Some(if available {
                    last_error_none
                } else {
                    last_error_down
                }),
                noise_weight: noise_weight.then_some(nw as abi::KernelFn<NoiseWeightArgs>),
                scan_map: scan_map.then_some(sm as abi::KernelFn<ScanMapArgs>),
                ..BackendTable::default()
            },
        }
    }

    static STATIC_TABLE: BackendTable = BackendTable {
        init: Some(init_ok),
        last_error: Some(last_error_none),
        scan_map: Some(sm),
        ..BackendTable::EMPTY
    };
    static STATIC_HEADER: abi::BackendHeader = abi::BackendHeader {
        magic: abi::MAGIC,
        abi_major: abi::ABI_MAJOR,
        abi_minor: abi::ABI_MINOR,
        table_size: std::mem::size_of::<BackendTable>() as u32,
        flags: abi::FLAG_HOST_ADDRESSABLE,
        name: c"linked".as_ptr(),
        version: c"2.0".as_ptr(),
        description: c"statically linked".as_ptr(),
        table: &STATIC_TABLE,
    };
    static FOREIGN: u64 = 0x1234;
    unsafe extern "C" fn static_entry() -> *const abi::BackendHeader {
        &STATIC_HEADER
    }
    unsafe extern "C" fn foreign_entry() -> *const abi::BackendHeader {
        &FOREIGN as *const u64 as *const abi::BackendHeader
    }

    #[test]
    fn register_entry_checks_the_header() {
        let mut r = Registry::new();
        // SAFETY: `static_entry` returns a complete static header.
        assert!(unsafe { r.register_entry(static_entry, "<linked>", "") }.unwrap());
        let e = r.entry("linked").unwrap();
        assert_eq!(e.source(), Source::Builtin);
        assert_eq!(e.plugin().version, "2.0");
        assert_eq!(e.plugin().kernels(), vec![abi::Kernel::ScanMap]);
        assert!(r.get("linked").is_ok());
        // SAFETY: the magic is read alone first and does not match, so
        // nothing past the 8 bytes of `FOREIGN` is read.
        let err = unsafe { r.register_entry(foreign_entry, "<foreign>", "") }.unwrap_err();
        assert!(
            matches!(err, LoadError::BadMagic { found: 0x1234, .. }),
            "{err:?}"
        );
        assert_eq!(r.failures().len(), 1);
        assert_eq!(r.failures()[0].source, Source::Builtin);
    }

    #[test]
    fn get_found_unavailable_and_not_found() {
        let mut r = Registry::new();
        assert!(r.register(fake("cpu", true, true, true), Source::Builtin, ""));
        assert!(r.register(fake("gpu", false, true, true), Source::Builtin, ""));
        assert_eq!(r.names(), vec!["cpu", "gpu"]);
        assert!(!r.entry("gpu").unwrap().is_initialised());
        assert_eq!(r.get("CPU").unwrap().name(), "cpu");
        match r.get("gpu") {
            Err(AccelError::Unavailable { backend, reason }) => {
                assert_eq!(backend, "gpu");
                assert_eq!(reason, "no device here");
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        match r.get("cuda") {
            Err(e @ AccelError::NotFound { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("no backend named `cuda`"), "{msg}");
                assert!(msg.contains("backends found: cpu, gpu"), "{msg}");
            }
            other => panic!("expected NotFound, got {other:?}"),
        }
    }

    #[test]
    fn same_name_is_shadowed() {
        let mut r = Registry::new();
        assert!(r.register(fake("cpu", true, true, false), Source::Builtin, ""));
        let mut second = fake("CPU", true, true, true);
        second.path = PathBuf::from("/elsewhere/libtoast_backend_cpu.so");
        assert!(!r.register(second, Source::System, ""));
        assert_eq!(r.entries().len(), 1);
        assert_eq!(r.shadowed().len(), 1);
        assert_eq!(r.shadowed()[0].winner, PathBuf::from("<test:cpu>"));
        assert_eq!(r.shadowed()[0].source, Source::System);
        // The first one is the one used.
        assert!(!r.get("cpu").unwrap().supports(abi::Kernel::ScanMap));
    }

    #[test]
    fn not_found_names_matching_failures_and_locations() {
        let dir = std::env::temp_dir().join(format!("toast-accel-registry-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bogus = dir.join(super::super::discovery::plugin_file_name("cuda"));
        std::fs::write(&bogus, b"this is not a shared library").unwrap();
        let missing = dir.join("gone.so");
        let r = Registry::discover(&DiscoveryOptions::only([dir.clone(), missing.clone()]));
        assert!(r.entries().is_empty());
        assert_eq!(r.failures().len(), 2, "{:?}", r.failures());
        assert!(r
            .failures()
            .iter()
            .any(|f| matches!(&f.error, LoadError::Missing { path } if *path == missing)));
        assert!(r
            .failures()
            .iter()
            .any(|f| matches!(&f.error, LoadError::NotLibrary { path, .. } | LoadError::Open { path, .. } if *path == bogus)));
        let msg = r.get("cuda").unwrap_err().to_string();
        // Refused before loading where the file format is checked (ELF),
        // else by the dynamic loader.
        assert!(
            msg.contains("not a loadable shared library: not an ELF file")
                || (!cfg!(target_os = "linux") && msg.contains("cannot open shared library")),
            "{msg}"
        );
        assert!(msg.contains(&bogus.display().to_string()), "{msg}");
        assert!(msg.contains(&dir.display().to_string()), "{msg}");
        assert!(msg.contains("1 other plugin file(s) failed"), "{msg}");
        let msg = r.get("gone").unwrap_err().to_string();
        assert!(msg.contains("no such file"), "{msg}");
    }
}
