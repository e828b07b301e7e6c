//! Data-level ("global") objects that can live on a device.
//!
//! TOAST keeps maps, pixel distributions and template amplitudes in the
//! `Data` dictionary; some of them are kernel arguments (`zmap` of
//! `build_noise_weighted`, the map of `scan_map`, the amplitudes of the
//! offset kernels, `global2local`). Here they are objects in
//! [`toast_core::Data::meta`], and this module says which of them have a
//! device representation and what its bytes are, so the pipeline's staging
//! and the kernel layer can treat a global item like an observation field:
//!
//! | stored type | device bytes |
//! |---|---|
//! | [`PixelData<T>`] (any element type) | the local buffer |
//! | `Arc<`[`PixelDistribution`]`>` | `global2local` (read-only: never written on a device) |
//! | [`HostArray<T>`] | the values (amplitudes, amplitude flags, offset variances) |
//!
//! Anything else (plain values, noise models) has no device representation
//! and is skipped by the staging.

use crate::pixels::{PixelData, PixelDistribution};
use std::sync::Arc;
use toast_core::{Element, Meta};

/// A plain 1-D array kept in the data's metadata (template amplitudes and
/// their flags, offset variances).
#[derive(Debug, Clone, PartialEq)]
pub struct HostArray<T: Element> {
    /// The values.
    pub values: Vec<T>,
}

impl<T: Element> HostArray<T> {
    /// `n` zeros.
    pub fn zeros(n: usize) -> Self {
        HostArray {
            values: vec![T::default(); n],
        }
    }
    /// Raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.values)
    }
    /// Raw bytes, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.values)
    }
}

macro_rules! try_types {
    ($meta:expr, $key:expr, $method:ident, $bytes:ident) => {{
        if let Ok(m) = $meta.$method::<PixelData<f64>>($key) {
            return Some(m.$bytes());
        }
        if let Ok(m) = $meta.$method::<PixelData<i64>>($key) {
            return Some(m.$bytes());
        }
        if let Ok(m) = $meta.$method::<PixelData<u8>>($key) {
            return Some(m.$bytes());
        }
        if let Ok(m) = $meta.$method::<PixelData<f32>>($key) {
            return Some(m.$bytes());
        }
        if let Ok(m) = $meta.$method::<PixelData<i32>>($key) {
            return Some(m.$bytes());
        }
        if let Ok(a) = $meta.$method::<HostArray<f64>>($key) {
            return Some(a.$bytes());
        }
        if let Ok(a) = $meta.$method::<HostArray<u8>>($key) {
            return Some(a.$bytes());
        }
        if let Ok(a) = $meta.$method::<HostArray<i64>>($key) {
            return Some(a.$bytes());
        }
    }};
}

/// The device bytes of the global item `key`, or `None` when it is missing
/// or has no device representation.
pub fn global_bytes<'a>(meta: &'a Meta, key: &str) -> Option<&'a [u8]> {
    try_types!(meta, key, object, as_bytes);
    if let Ok(d) = meta.object::<Arc<PixelDistribution>>(key) {
        return Some(d.global2local_bytes());
    }
    None
}

/// The device bytes of the global item `key`, mutably, or `None` when it is
/// missing, has no device representation, or is read-only on devices (a
/// pixel distribution).
pub fn global_bytes_mut<'a>(meta: &'a mut Meta, key: &str) -> Option<&'a mut [u8]> {
    // The borrow checker cannot see that the early returns of a chain of
    // `object_mut` calls end each borrow, so test the type first.
    macro_rules! probe {
        ($t:ty, $bytes:ident) => {
            if meta.object::<$t>(key).is_ok() {
                return meta.object_mut::<$t>(key).ok().map(|m| m.$bytes());
            }
        };
    }
    probe!(PixelData<f64>, as_bytes_mut);
    probe!(PixelData<i64>, as_bytes_mut);
    probe!(PixelData<u8>, as_bytes_mut);
    probe!(PixelData<f32>, as_bytes_mut);
    probe!(PixelData<i32>, as_bytes_mut);
    probe!(HostArray<f64>, as_bytes_mut);
    probe!(HostArray<u8>, as_bytes_mut);
    probe!(HostArray<i64>, as_bytes_mut);
    None
}

/// Whether the global item `key` has a device representation.
pub fn is_device_item(meta: &Meta, key: &str) -> bool {
    global_bytes(meta, key).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_of_known_types() {
        let mut meta = Meta::new("data");
        let dist = Arc::new(PixelDistribution::new(12, 4, &[1, 3]).unwrap());
        meta.set_object("dist", dist.clone());
        meta.set_object("map", PixelData::<f64>::new(dist, 3));
        meta.set_object("amps", HostArray::<f64>::zeros(5));
        meta.set("plain", 3i64);
        assert_eq!(global_bytes(&meta, "dist").unwrap().len(), 4 * 8);
        assert_eq!(global_bytes(&meta, "map").unwrap().len(), 2 * 3 * 3 * 8);
        assert_eq!(global_bytes(&meta, "amps").unwrap().len(), 40);
        assert!(global_bytes(&meta, "plain").is_none());
        assert!(global_bytes(&meta, "missing").is_none());
        global_bytes_mut(&mut meta, "amps").unwrap()[0..8].copy_from_slice(&2.5f64.to_ne_bytes());
        assert_eq!(
            meta.object::<HostArray<f64>>("amps").unwrap().values[0],
            2.5
        );
        assert!(global_bytes_mut(&mut meta, "dist").is_none());
        assert!(is_device_item(&meta, "map"));
    }
}
