//! toast-ops: operators and pipelines.
