//! Which backend runs a kernel call.
//!
//! A [`DispatchPolicy`] names backends at five levels. For a call of kernel
//! `k` made by operator `o`, the levels are tried in this order:
//!
//! 1. the kernel override for `k` (`kernel.scan_map=cuda`),
//! 2. the operator override for `o` (`operator.MapMaker=hip`),
//! 3. the pipeline setting (`pipeline=opencl`),
//! 4. the run setting (`run=cuda`),
//! 5. the default, [`DEFAULT_BACKEND`] (`cpu`).
//!
//! Levels that name nothing are skipped, and a backend named at several
//! levels is tried once, at its first. The first backend that is found,
//! initialises, and has a (non-null) entry for `k` runs the call; every one
//! passed over is recorded in [`Resolved::fallbacks`] with the reason, and a
//! `tracing` debug line says what happened. The resolved backend is part of
//! the timer name ([`Resolved::timer_name`]), so what actually ran is never
//! a guess (TOAST 3 silently ignores its per-operator setting; we do not).

use super::backend::Backend;
use super::error::AccelError;
use super::registry::Registry;
use crate::abi::Kernel;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The backend used when no level names one, and the last resort.
pub const DEFAULT_BACKEND: &str = "cpu";

/// A level of the dispatch order, highest priority first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DispatchLevel {
    Kernel,
    Operator,
    Pipeline,
    Run,
    Default,
}

impl fmt::Display for DispatchLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DispatchLevel::Kernel => "kernel override",
            DispatchLevel::Operator => "operator override",
            DispatchLevel::Pipeline => "pipeline setting",
            DispatchLevel::Run => "run setting",
            DispatchLevel::Default => "default",
        })
    }
}

/// Backend choices at each level. Backend and operator names are compared
/// ignoring ASCII case (backends) and exactly (operators).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DispatchPolicy {
    /// The run-wide backend (`run=NAME`).
    pub run: Option<String>,
    /// The backend of the pipeline being executed (`pipeline=NAME`).
    pub pipeline: Option<String>,
    /// Per-operator overrides (`operator.OPERATOR=NAME`).
    pub operators: BTreeMap<String, String>,
    /// Per-kernel overrides (`kernel.KERNEL=NAME`).
    pub kernels: BTreeMap<Kernel, String>,
}

/// The outcome of dispatch for one kernel call.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The backend that runs the call.
    pub backend: Arc<Backend>,
    pub kernel: Kernel,
    pub operator: Option<String>,
    /// The backend the policy asked for (its highest level that names one).
    pub requested: String,
    /// The level that named the backend that runs the call.
    pub level: DispatchLevel,
    /// Backends passed over, in order, each with why (the reason names the
    /// level that asked for it).
    pub fallbacks: Vec<(String, String)>,
}

impl Resolved {
    /// The name of the backend that runs the call.
    pub fn backend_name(&self) -> &str {
        self.backend.name()
    }

    /// Whether the call runs somewhere other than where it was requested.
    pub fn fell_back(&self) -> bool {
        !self.fallbacks.is_empty()
    }

    /// The timer name of the call: `"{operator}.{kernel}[{backend}]"`, or
    /// `"{kernel}[{backend}]"` without an operator.
    pub fn timer_name(&self) -> String {
        match &self.operator {
            Some(op) => format!("{op}.{}[{}]", self.kernel, self.backend_name()),
            None => format!("{}[{}]", self.kernel, self.backend_name()),
        }
    }
}

fn valid_backend_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn policy_error(setting: &str, reason: impl Into<String>) -> AccelError {
    AccelError::Policy {
        setting: setting.to_string(),
        reason: reason.into(),
    }
}

impl DispatchPolicy {
    /// A policy that names nothing: every kernel runs on `cpu`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set the run-wide backend.
    pub fn with_run(mut self, backend: &str) -> Self {
        self.run = Some(backend.to_string());
        self
    }

    /// Set the run-wide backend from a user's input (`--backend`), checked
    /// as [`DispatchPolicy::apply`] checks a backend name.
    pub fn set_run(&mut self, backend: &str) -> Result<(), AccelError> {
        if !valid_backend_name(backend) {
            return Err(policy_error(
                &format!("run={backend}"),
                format!(
                    "`{backend}` is not a backend name (letters, digits, `_` and `-`, not empty)"
                ),
            ));
        }
        self.run = Some(backend.to_string());
        Ok(())
    }

    /// Set (or clear) the pipeline backend.
    pub fn with_pipeline(mut self, backend: Option<&str>) -> Self {
        self.pipeline = backend.map(str::to_string);
        self
    }

    /// Override the backend of every kernel that `operator` calls.
    pub fn with_operator(mut self, operator: &str, backend: &str) -> Self {
        self.operators
            .insert(operator.to_string(), backend.to_string());
        self
    }

    /// Override the backend of `kernel`.
    pub fn with_kernel(mut self, kernel: Kernel, backend: &str) -> Self {
        self.kernels.insert(kernel, backend.to_string());
        self
    }

    /// Apply one setting: `run=NAME`, `pipeline=NAME`,
    /// `operator.OPERATOR=NAME` or `kernel.KERNEL=NAME` (kernel names as
    /// [`Kernel::name`], any case). A later setting of the same key wins.
    pub fn apply(&mut self, setting: &str) -> Result<(), AccelError> {
        let s = setting.trim();
        let Some((key, value)) = s.split_once('=') else {
            return Err(policy_error(
                setting,
                "expected KEY=BACKEND with KEY one of run, pipeline, operator.NAME, kernel.NAME",
            ));
        };
        let (key, value) = (key.trim(), value.trim());
        if !valid_backend_name(value) {
            return Err(policy_error(
                setting,
                format!(
                    "`{value}` is not a backend name (letters, digits, `_` and `-`, not empty)"
                ),
            ));
        }
        let value = value.to_string();
        if key == "run" {
            self.run = Some(value);
        } else if key == "pipeline" {
            self.pipeline = Some(value);
        } else if let Some(op) = key.strip_prefix("operator.") {
            if op.is_empty() {
                return Err(policy_error(setting, "empty operator name"));
            }
            self.operators.insert(op.to_string(), value);
        } else if let Some(k) = key.strip_prefix("kernel.") {
            let Some(kernel) = Kernel::from_name(k) else {
                let names: Vec<&str> = Kernel::ALL.iter().map(|k| k.name()).collect();
                return Err(policy_error(
                    setting,
                    format!("unknown kernel `{k}`; kernels are {}", names.join(", ")),
                ));
            };
            self.kernels.insert(kernel, value);
        } else {
            return Err(policy_error(
                setting,
                format!(
                    "unknown key `{key}`; expected run, pipeline, operator.NAME or kernel.NAME"
                ),
            ));
        }
        Ok(())
    }

    /// The settings of this policy as `(key, backend)` pairs, keys as
    /// [`DispatchPolicy::apply`] reads them (`run`, `pipeline`,
    /// `operator.NAME`, `kernel.NAME`), highest level last.
    pub fn named_backends(&self) -> Vec<(String, &str)> {
        let mut v: Vec<(String, &str)> = Vec::new();
        v.extend(self.run.as_deref().map(|b| ("run".to_string(), b)));
        v.extend(
            self.pipeline
                .as_deref()
                .map(|b| ("pipeline".to_string(), b)),
        );
        v.extend(
            self.operators
                .iter()
                .map(|(op, b)| (format!("operator.{op}"), b.as_str())),
        );
        v.extend(
            self.kernels
                .iter()
                .map(|(k, b)| (format!("kernel.{}", k.name()), b.as_str())),
        );
        v
    }

    /// A policy from settings as [`DispatchPolicy::apply`] reads them.
    pub fn from_settings<I, S>(settings: I) -> Result<Self, AccelError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut p = Self::default();
        for s in settings {
            p.apply(s.as_ref())?;
        }
        Ok(p)
    }

    /// A policy from a list of settings separated by `,` or `;`
    /// (`"run=cuda, kernel.scan_map=cpu"`); empty items are ignored.
    pub fn parse(list: &str) -> Result<Self, AccelError> {
        Self::from_settings(
            list.split([',', ';'])
                .map(str::trim)
                .filter(|s| !s.is_empty()),
        )
    }

    /// The settings, one string each, in the form [`DispatchPolicy::apply`]
    /// reads.
    pub fn settings(&self) -> Vec<String> {
        self.named_backends()
            .into_iter()
            .map(|(key, backend)| format!("{key}={backend}"))
            .collect()
    }

    /// The backends to try for `kernel` called by `operator`, in order, with
    /// the level naming each; a backend named at several levels appears
    /// once. Always ends with [`DEFAULT_BACKEND`].
    pub fn chain(&self, kernel: Kernel, operator: Option<&str>) -> Vec<(DispatchLevel, &str)> {
        let levels = [
            (DispatchLevel::Kernel, self.kernels.get(&kernel)),
            (
                DispatchLevel::Operator,
                operator.and_then(|o| self.operators.get(o)),
            ),
            (DispatchLevel::Pipeline, self.pipeline.as_ref()),
            (DispatchLevel::Run, self.run.as_ref()),
        ];
        let mut chain: Vec<(DispatchLevel, &str)> = Vec::with_capacity(5);
        let named = levels
            .into_iter()
            .filter_map(|(l, b)| b.map(|b| (l, b.as_str())))
            .chain(std::iter::once((DispatchLevel::Default, DEFAULT_BACKEND)));
        for (level, backend) in named {
            if !chain.iter().any(|(_, b)| b.eq_ignore_ascii_case(backend)) {
                chain.push((level, backend));
            }
        }
        chain
    }

    /// Resolve the backend for `kernel` called by `operator` among the
    /// backends of `registry`, falling back along [`DispatchPolicy::chain`].
    ///
    /// Errors with [`AccelError::NoBackend`] when no backend of the chain,
    /// `cpu` included, can run the kernel; it lists each and why.
    pub fn resolve(
        &self,
        registry: &Registry,
        kernel: Kernel,
        operator: Option<&str>,
    ) -> Result<Resolved, AccelError> {
        let chain = self.chain(kernel, operator);
        let requested = chain[0].1.to_string();
        let mut fallbacks: Vec<(String, String)> = Vec::new();
        for (level, name) in chain {
            // `entry` rather than `get`: a miss here is routine and must not
            // build `get`'s long not-found report.
            let why = match registry.entry(name).map(|e| e.backend()) {
                Some(Ok(backend)) if backend.supports(kernel) => {
                    let resolved = Resolved {
                        backend: Arc::clone(backend),
                        kernel,
                        operator: operator.map(str::to_string),
                        requested,
                        level,
                        fallbacks,
                    };
                    log_resolution(&resolved);
                    return Ok(resolved);
                }
                Some(Ok(_)) => format!("does not implement kernel `{kernel}`"),
                Some(Err(reason)) => format!("unavailable: {reason}"),
                None => "no such backend was found".to_string(),
            };
            fallbacks.push((name.to_string(), format!("{why} (named by the {level})")));
        }
        let tried: Vec<String> = fallbacks
            .iter()
            .map(|(b, why)| format!("`{b}` {why}"))
            .collect();
        Err(AccelError::NoBackend {
            kernel,
            operator: operator.unwrap_or("(none)").to_string(),
            tried: tried.join("; "),
        })
    }
}

fn log_resolution(r: &Resolved) {
    let op = r.operator.as_deref().unwrap_or("(none)");
    if r.fallbacks.is_empty() {
        tracing::debug!(
            "kernel {} for operator {op} resolved to backend {} (requested {} by the {})",
            r.kernel,
            r.backend_name(),
            r.requested,
            r.level
        );
    } else {
        let why: Vec<String> = r
            .fallbacks
            .iter()
            .map(|(b, reason)| format!("{b}: {reason}"))
            .collect();
        tracing::debug!(
            "kernel {} for operator {op} resolved to backend {} (requested {}; fell back because {})",
            r.kernel,
            r.backend_name(),
            r.requested,
            why.join("; ")
        );
    }
}

impl fmt::Display for DispatchPolicy {
    /// The settings joined by `,` (what [`DispatchPolicy::parse`] reads).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.settings().join(","))
    }
}

impl FromStr for DispatchPolicy {
    type Err = AccelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Calls and seconds of one kernel on one backend.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KernelUse {
    /// Kernel calls.
    pub calls: u64,
    /// Seconds spent in them (the launch, as the kernel timers measure).
    pub seconds: f64,
}

/// Which backend ran each kernel, recorded by the kernel call layer at
/// every launch ([`Dispatcher::record`]): the data behind a run's "kernels:"
/// summary and per-kernel statistics, keyed by TOAST's kernel name, then
/// backend name.
pub type KernelLog = BTreeMap<String, BTreeMap<String, KernelUse>>;

/// A registry and a policy: what operators hold to resolve their kernels.
/// Clones (and [`Dispatcher::for_pipeline`]) share one [`KernelLog`].
#[derive(Debug, Clone)]
pub struct Dispatcher {
    registry: Arc<Registry>,
    policy: DispatchPolicy,
    log: Arc<std::sync::Mutex<KernelLog>>,
}

impl Dispatcher {
    pub fn new(registry: Arc<Registry>, policy: DispatchPolicy) -> Self {
        Dispatcher {
            registry,
            policy,
            log: Arc::default(),
        }
    }
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }
    pub fn policy(&self) -> &DispatchPolicy {
        &self.policy
    }
    /// The same registry and policy with the pipeline level set to `backend`.
    pub fn for_pipeline(&self, backend: Option<&str>) -> Dispatcher {
        Dispatcher {
            registry: Arc::clone(&self.registry),
            policy: self.policy.clone().with_pipeline(backend),
            log: Arc::clone(&self.log),
        }
    }

    /// Record that `backend` ran one call of `kernel` in `seconds`.
    pub fn record(&self, kernel: Kernel, backend: &str, seconds: f64) {
        // A poisoned lock only means another thread panicked while
        // recording; the counts it holds are still whole numbers.
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let u = log
            .entry(kernel.to_string())
            .or_default()
            .entry(backend.to_string())
            .or_default();
        u.calls += 1;
        u.seconds += seconds;
    }

    /// What ran where so far (see [`KernelLog`]).
    pub fn kernel_log(&self) -> KernelLog {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    /// See [`DispatchPolicy::resolve`].
    pub fn resolve(&self, kernel: Kernel, operator: Option<&str>) -> Result<Resolved, AccelError> {
        self.policy.resolve(&self.registry, kernel, operator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::discovery::Source;
    use crate::host::registry::tests::fake;

    const NW: Kernel = Kernel::NoiseWeight;
    const SM: Kernel = Kernel::ScanMap;

    /// cpu: both kernels; fast: noise_weight only; other: scan_map only;
    /// down: unavailable; also: both kernels.
    fn registry() -> Arc<Registry> {
        let mut r = Registry::new();
        r.register(fake("cpu", true, true, true), Source::Builtin, "");
        r.register(fake("fast", true, true, false), Source::Builtin, "");
        r.register(fake("other", true, false, true), Source::Builtin, "");
        r.register(fake("down", false, true, true), Source::Builtin, "");
        r.register(fake("also", true, true, true), Source::Builtin, "");
        Arc::new(r)
    }

    fn full_policy() -> DispatchPolicy {
        DispatchPolicy::new()
            .with_run("also")
            .with_pipeline(Some("other"))
            .with_operator("MapMaker", "fast")
            .with_kernel(NW, "fast")
    }

    fn check(r: &Resolved, backend: &str, level: DispatchLevel, fallbacks: &[&str]) {
        assert_eq!(r.backend_name(), backend, "{r:?}");
        assert_eq!(r.level, level, "{r:?}");
        let fb: Vec<&str> = r.fallbacks.iter().map(|(b, _)| b.as_str()).collect();
        assert_eq!(fb, fallbacks, "{r:?}");
    }

    #[test]
    fn shared_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Registry>();
        send_sync::<Dispatcher>();
        send_sync::<Resolved>();
    }

    #[test]
    fn default_is_cpu() {
        let reg = registry();
        let r = DispatchPolicy::new().resolve(&reg, NW, None).unwrap();
        check(&r, "cpu", DispatchLevel::Default, &[]);
        assert_eq!(r.requested, "cpu");
        assert_eq!(r.timer_name(), "noise_weight[cpu]");
    }

    #[test]
    fn run_level() {
        let reg = registry();
        let p = DispatchPolicy::new().with_run("also");
        let r = p.resolve(&reg, NW, Some("NoiseWeight")).unwrap();
        check(&r, "also", DispatchLevel::Run, &[]);
        assert_eq!(r.timer_name(), "NoiseWeight.noise_weight[also]");
    }

    #[test]
    fn pipeline_beats_run() {
        let reg = registry();
        let p = DispatchPolicy::new()
            .with_run("also")
            .with_pipeline(Some("other"));
        let r = p.resolve(&reg, SM, Some("Scan")).unwrap();
        check(&r, "other", DispatchLevel::Pipeline, &[]);
        // Clearing the pipeline level goes back to the run level.
        let r = p
            .with_pipeline(None)
            .resolve(&reg, SM, Some("Scan"))
            .unwrap();
        check(&r, "also", DispatchLevel::Run, &[]);
    }

    #[test]
    fn operator_beats_pipeline() {
        let reg = registry();
        let p = DispatchPolicy::new()
            .with_pipeline(Some("also"))
            .with_operator("MapMaker", "other");
        let r = p.resolve(&reg, SM, Some("MapMaker")).unwrap();
        check(&r, "other", DispatchLevel::Operator, &[]);
        // Another operator, or none, is not overridden.
        let r = p.resolve(&reg, SM, Some("Scan")).unwrap();
        check(&r, "also", DispatchLevel::Pipeline, &[]);
        let r = p.resolve(&reg, SM, None).unwrap();
        check(&r, "also", DispatchLevel::Pipeline, &[]);
    }

    #[test]
    fn kernel_beats_operator() {
        let reg = registry();
        let p = full_policy();
        let r = p.resolve(&reg, NW, Some("MapMaker")).unwrap();
        check(&r, "fast", DispatchLevel::Kernel, &[]);
        let p = p.with_operator("MapMaker", "also").with_kernel(NW, "cpu");
        let r = p.resolve(&reg, NW, Some("MapMaker")).unwrap();
        check(&r, "cpu", DispatchLevel::Kernel, &[]);
        assert_eq!(r.requested, "cpu");
    }

    #[test]
    fn falls_back_when_kernel_missing() {
        let reg = registry();
        // MapMaker's override `fast` lacks scan_map: next is the pipeline's `other`.
        let r = full_policy().resolve(&reg, SM, Some("MapMaker")).unwrap();
        check(&r, "other", DispatchLevel::Pipeline, &["fast"]);
        assert_eq!(r.requested, "fast");
        assert!(r.fell_back());
        assert!(
            r.fallbacks[0]
                .1
                .contains("does not implement kernel `scan_map`"),
            "{:?}",
            r.fallbacks
        );
        assert!(
            r.fallbacks[0].1.contains("operator override"),
            "{:?}",
            r.fallbacks
        );
        assert_eq!(r.timer_name(), "MapMaker.scan_map[other]");
    }

    #[test]
    fn falls_back_when_unavailable_or_not_found() {
        let reg = registry();
        let p = DispatchPolicy::new()
            .with_kernel(NW, "down")
            .with_operator("Op", "cuda")
            .with_run("fast");
        let r = p.resolve(&reg, NW, Some("Op")).unwrap();
        check(&r, "fast", DispatchLevel::Run, &["down", "cuda"]);
        assert!(r.fallbacks[0].1.contains("unavailable: no device here"));
        assert!(r.fallbacks[0].1.contains("kernel override"));
        assert!(r.fallbacks[1].1.contains("no such backend"));
    }

    #[test]
    fn falls_back_to_cpu_at_the_end() {
        let reg = registry();
        let p = DispatchPolicy::new()
            .with_run("fast")
            .with_pipeline(Some("down"));
        let r = p.resolve(&reg, SM, None).unwrap();
        check(&r, "cpu", DispatchLevel::Default, &["down", "fast"]);
        assert_eq!(r.timer_name(), "scan_map[cpu]");
    }

    #[test]
    fn a_backend_named_twice_is_tried_once() {
        let reg = registry();
        let p = DispatchPolicy::new()
            .with_kernel(SM, "fast")
            .with_run("FAST");
        assert_eq!(
            p.chain(SM, None),
            vec![
                (DispatchLevel::Kernel, "fast"),
                (DispatchLevel::Default, "cpu")
            ]
        );
        let r = p.resolve(&reg, SM, None).unwrap();
        check(&r, "cpu", DispatchLevel::Default, &["fast"]);
    }

    #[test]
    fn no_backend_when_cpu_is_missing_too() {
        let mut r = Registry::new();
        r.register(fake("fast", true, true, false), Source::Builtin, "");
        let e = DispatchPolicy::new()
            .with_run("fast")
            .resolve(&r, SM, Some("Scan"))
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, AccelError::NoBackend { kernel: SM, .. }),
            "{e:?}"
        );
        assert!(msg.contains("operator `Scan`"), "{msg}");
        assert!(
            msg.contains("`fast` does not implement kernel `scan_map`"),
            "{msg}"
        );
        assert!(msg.contains("`cpu` no such backend was found"), "{msg}");
    }

    #[test]
    fn dispatcher_for_pipeline() {
        let d = Dispatcher::new(registry(), DispatchPolicy::new().with_run("also"));
        check(
            &d.resolve(NW, None).unwrap(),
            "also",
            DispatchLevel::Run,
            &[],
        );
        let p = d.for_pipeline(Some("fast"));
        check(
            &p.resolve(NW, None).unwrap(),
            "fast",
            DispatchLevel::Pipeline,
            &[],
        );
        assert_eq!(d.policy().pipeline, None);
    }

    #[test]
    fn parse_settings() {
        let p = DispatchPolicy::parse(
            " run=cuda, pipeline=hip;operator.MapMaker = opencl,kernel.scan_map=cpu,kernel.STOKES_WEIGHTS_IQU=cuda ,",
        )
        .unwrap();
        assert_eq!(p.run.as_deref(), Some("cuda"));
        assert_eq!(p.pipeline.as_deref(), Some("hip"));
        assert_eq!(
            p.operators.get("MapMaker").map(String::as_str),
            Some("opencl")
        );
        assert_eq!(p.kernels.get(&SM).map(String::as_str), Some("cpu"));
        assert_eq!(
            p.kernels.get(&Kernel::StokesWeightsIqu).map(String::as_str),
            Some("cuda")
        );
        // Display round-trips.
        let again: DispatchPolicy = p.to_string().parse().unwrap();
        assert_eq!(again, p);
        assert_eq!(
            p.settings(),
            vec![
                "run=cuda",
                "pipeline=hip",
                "operator.MapMaker=opencl",
                "kernel.stokes_weights_IQU=cuda",
                "kernel.scan_map=cpu",
            ]
        );
        // A later setting wins.
        let p = DispatchPolicy::from_settings(["run=cuda", "run=hip"]).unwrap();
        assert_eq!(p.run.as_deref(), Some("hip"));
    }

    #[test]
    fn parse_errors_name_the_setting() {
        for (s, needle) in [
            ("kernel.scan_mop=cuda", "unknown kernel `scan_mop`"),
            ("backend=cuda", "unknown key `backend`"),
            ("run", "expected KEY=BACKEND"),
            ("run=", "is not a backend name"),
            ("run=cu da", "is not a backend name"),
            ("operator.=cuda", "empty operator name"),
        ] {
            let e = DispatchPolicy::parse(s).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, AccelError::Policy { .. }), "{s}: {e:?}");
            assert!(msg.contains(needle), "{s}: {msg}");
            assert!(msg.contains(s.trim()), "{s}: {msg}");
        }
    }
}
