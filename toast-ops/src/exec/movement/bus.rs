//! What crossed the bus, and when: the map-maker's transfer accounting.
//!
//! Every backend counts its own copies (`toast_accel::host::TransferStats`,
//! cumulative since it was loaded). A [`BusBytes`] is the sum of those
//! counters over the backends of the run's dispatcher that are loaded, taken
//! at one moment; the difference of two is what moved in between. The solver
//! takes one before its first CG iteration, one after each iteration and
//! one after the last, so a run reports bytes per phase (setup, each CG
//! iteration, outputs; see `toast_ops::workflow::TransferPhases`). A
//! host-addressable backend (the CPU plugin) never copies, so on the CPU
//! every figure is zero.

use serde::Serialize;
use toast_accel::host::Dispatcher;
use toast_core::ExecContext;

/// The bus counters around the CG iterations of the last solve (an
/// [`ExecContext`] extension the solver inserts; a run's phases follow from
/// it, `toast_ops::workflow::TransferPhases`). Kept out of the map-maker's
/// result, which is the same on every backend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgTransfers {
    /// The counters just before the first CG iteration.
    pub before: BusBytes,
    /// What crossed the bus in each CG iteration, in order.
    pub per_iteration: Vec<BusBytes>,
    /// The counters just after the last CG iteration.
    pub after: BusBytes,
}

/// Copies between host and device so far (or between two moments), summed
/// over the loaded backends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BusBytes {
    /// Host→device bytes.
    pub host_to_device_bytes: u64,
    /// Host→device copies.
    pub host_to_device_calls: u64,
    /// Device→host bytes.
    pub device_to_host_bytes: u64,
    /// Device→host copies.
    pub device_to_host_calls: u64,
}

impl BusBytes {
    /// The counters now, over the backends of the context's dispatcher that
    /// are loaded (none, with no dispatcher: all zero).
    pub fn now(ctx: &ExecContext) -> Self {
        let Some(d) = ctx.extensions.get::<Dispatcher>() else {
            return BusBytes::default();
        };
        let reg = d.registry();
        reg.names()
            .into_iter()
            .filter_map(|n| reg.entry(n))
            .filter(|e| e.is_initialised())
            .filter_map(|e| e.backend().ok())
            .map(|b| b.stats().snapshot())
            .fold(BusBytes::default(), |a, s| BusBytes {
                host_to_device_bytes: a.host_to_device_bytes + s.h2d_bytes,
                host_to_device_calls: a.host_to_device_calls + s.h2d_calls,
                device_to_host_bytes: a.device_to_host_bytes + s.d2h_bytes,
                device_to_host_calls: a.device_to_host_calls + s.d2h_calls,
            })
    }

    /// What moved between `earlier` and `self` (counters only grow; a
    /// backend's reset in between would count as zero, not wrap).
    pub fn since(self, earlier: BusBytes) -> BusBytes {
        BusBytes {
            host_to_device_bytes: self
                .host_to_device_bytes
                .saturating_sub(earlier.host_to_device_bytes),
            host_to_device_calls: self
                .host_to_device_calls
                .saturating_sub(earlier.host_to_device_calls),
            device_to_host_bytes: self
                .device_to_host_bytes
                .saturating_sub(earlier.device_to_host_bytes),
            device_to_host_calls: self
                .device_to_host_calls
                .saturating_sub(earlier.device_to_host_calls),
        }
    }

    /// Bytes both ways.
    pub fn total_bytes(&self) -> u64 {
        self.host_to_device_bytes + self.device_to_host_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_the_difference_and_never_wraps() {
        let a = BusBytes {
            host_to_device_bytes: 100,
            host_to_device_calls: 2,
            device_to_host_bytes: 40,
            device_to_host_calls: 1,
        };
        let b = BusBytes {
            host_to_device_bytes: 196,
            host_to_device_calls: 3,
            device_to_host_bytes: 136,
            device_to_host_calls: 2,
        };
        let d = b.since(a);
        assert_eq!(
            (d.host_to_device_bytes, d.host_to_device_calls),
            (96, 1),
            "{d:?}"
        );
        assert_eq!((d.device_to_host_bytes, d.device_to_host_calls), (96, 1));
        assert_eq!(d.total_bytes(), 192);
        assert_eq!(a.since(b), BusBytes::default());
    }

    #[test]
    fn no_dispatcher_counts_nothing() {
        let ctx = ExecContext::default();
        assert_eq!(BusBytes::now(&ctx), BusBytes::default());
    }
}
