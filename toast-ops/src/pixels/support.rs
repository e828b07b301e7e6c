//! A map's *support*: the local pixels that a set of samples can reach.
//!
//! A pixel-domain step over a whole map (the map reset and `m ← C m` of
//! every binning pass) reads every local pixel, although a scan hits few of
//! them: tiny's 12 detectors hit 144,233 pixels of the 2,798,592 local
//! ones (911 submaps of 3,072), so the solver read 67 MB of mostly zero
//! map twice per CG iteration (about 11 ms at 2 threads). A
//! [`PixelSupport`] lists, once per solve, the local pixels that any sample
//! of the data points at (whatever its flags, since flags only remove
//! samples); an accumulation of those samples writes nowhere else, so a
//! map that is zero outside the list stays so, and the reset and the
//! covariance need to visit only the listed pixels
//! ([`PixelData::confine_to`]). The listed steps give the same values, bit
//! for bit, as the full ones: outside the support they would only rewrite
//! `+0` with `+0`.
//!
//! The support holds for one process's samples: a map summed over
//! processes (`sync_maps`) can be non-zero where another process's samples
//! point, so a caller confines a map only in a one-process run, and only
//! on the host (a device copy is reset and multiplied by the kernels).
//!
//! [`PixelData::confine_to`]: super::PixelData::confine_to

use super::PixelDistribution;
use rayon::prelude::*;
use toast_core::OpError;

/// The metadata key under which a pipeline registers (as an
/// `Arc<PixelSupport>`) the support of the
/// samples that use pixel distribution `dist_key`: the maps made for that
/// distribution (`mapmaker_utils::ensure_map`) are then
/// prefaulted at those pixels ([`PixelData::prefault`]). Registering one
/// changes no value, only which pages are committed first.
///
/// [`PixelData::prefault`]: super::PixelData::prefault
pub fn support_key(dist_key: &str) -> String {
    format!("{dist_key}.support")
}

/// Pixels of the support per task of the pixel-domain steps.
pub(crate) const TASK_PIXELS: usize = 4096;

/// The ascending local flat indices (as [`PixelDistribution::local_index`]
/// gives them) of the pixels that some samples point at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PixelSupport {
    n_local_pix: usize,
    pixels: Vec<u32>,
}

impl PixelSupport {
    /// The support of the samples whose pixel numbers are in `fields` (one
    /// slice per detector and observation, global pixel numbers, negative
    /// for a sample with no pixel). A pixel outside the local submaps is an
    /// error (no accumulation could use it either).
    pub fn from_pixels<'a, P>(
        dist: &PixelDistribution,
        fields: Vec<(&'a str, &'a [P])>,
    ) -> Result<Self, OpError>
    where
        P: Copy + Into<i64> + Sync + 'a,
    {
        let n_local_pix = dist.n_local_submap() * dist.n_pix_submap() as usize;
        if u32::try_from(n_local_pix).is_err() {
            return Err(OpError::InvalidData {
                what: format!(
                    "a pixel support of {n_local_pix} local pixels (more than 2^32) is not supported"
                ),
            });
        }
        let words = n_local_pix.div_ceil(64);
        // One bitmap per task, OR-ed together.
        let bits = fields
            .par_iter()
            .try_fold(
                || vec![0u64; words],
                |mut bits, &(name, pixels)| {
                    for &p in pixels {
                        let p: i64 = p.into();
                        if p < 0 {
                            continue;
                        }
                        let Some(i) = dist.local_index(p) else {
                            return Err(OpError::InvalidData {
                                what: format!(
                                    "pixel {p} of '{name}' is not in a local submap of the \
                                     distribution"
                                ),
                            });
                        };
                        bits[i / 64] |= 1 << (i % 64);
                    }
                    Ok(bits)
                },
            )
            .try_reduce(
                || vec![0u64; words],
                |mut a, b| {
                    a.iter_mut().zip(&b).for_each(|(x, y)| *x |= y);
                    Ok(a)
                },
            )?;
        let mut pixels = Vec::new();
        for (w, &word) in bits.iter().enumerate() {
            let mut rest = word;
            while rest != 0 {
                pixels.push((w * 64) as u32 + rest.trailing_zeros());
                rest &= rest - 1;
            }
        }
        Ok(PixelSupport {
            n_local_pix,
            pixels,
        })
    }

    /// The local pixels, ascending.
    pub fn pixels(&self) -> &[u32] {
        &self.pixels
    }

    /// The number of local pixels of the distribution it was made for.
    pub fn n_local_pix(&self) -> usize {
        self.n_local_pix
    }
}

/// Split `values` (`n_value` per local pixel) into one mutable piece per
/// task of [`TASK_PIXELS`] support pixels, each with the support pixels it
/// covers and the local index of its first element: disjoint pieces for a
/// parallel pass over the support without `unsafe`.
pub(crate) fn split_by_support<'a, T>(
    values: &'a mut [T],
    n_value: usize,
    support: &'a [u32],
) -> Vec<(&'a [u32], usize, &'a mut [T])> {
    let mut pieces = Vec::with_capacity(support.len().div_ceil(TASK_PIXELS));
    let mut rest = values;
    let mut base = 0usize;
    for task in support.chunks(TASK_PIXELS) {
        let (lo, hi) = (task[0] as usize, task[task.len() - 1] as usize + 1);
        let tail = std::mem::take(&mut rest);
        let (_, tail) = tail.split_at_mut((lo - base) * n_value);
        let (piece, tail) = tail.split_at_mut((hi - lo) * n_value);
        rest = tail;
        base = hi;
        pieces.push((task, lo, piece));
    }
    pieces
}

/// Calls `f(p, values)` with each support pixel `p` and its `n_value`
/// values, in parallel over tasks of [`TASK_PIXELS`] pixels (disjoint
/// pieces from [`split_by_support`]).
pub(crate) fn for_each_support_pixel<T: Send>(
    values: &mut [T],
    n_value: usize,
    support: &[u32],
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    split_by_support(values, n_value, support)
        .into_par_iter()
        .for_each(|(task, lo, piece)| {
            for &p in task {
                let p = p as usize;
                f(p, &mut piece[(p - lo) * n_value..][..n_value]);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist() -> PixelDistribution {
        // 8 submaps of 16 pixels, submaps 1, 4 and 6 local.
        PixelDistribution::new(128, 8, &[1, 4, 6]).unwrap()
    }

    #[test]
    fn support_lists_each_pointed_pixel_once_ascending() {
        let d = dist();
        let a: Vec<i64> = vec![100, 16, -1, 17, 16, 64];
        let b: Vec<i64> = vec![-5, 79, 31];
        let s = PixelSupport::from_pixels(&d, vec![("a", &a[..]), ("b", &b[..])]).unwrap();
        let mut want: Vec<u32> = [100i64, 16, 17, 64, 79, 31]
            .iter()
            .map(|&p| d.local_index(p).unwrap() as u32)
            .collect();
        want.sort();
        want.dedup();
        assert_eq!(s.pixels(), &want[..]);
        assert_eq!(s.n_local_pix(), 48);
        let c: Vec<i32> = vec![16, 17];
        let s32 = PixelSupport::from_pixels(&d, vec![("c", &c[..])]).unwrap();
        assert_eq!(s32.pixels(), &[0, 1]);
    }

    #[test]
    fn pixel_outside_the_local_submaps_is_an_error_naming_it() {
        let d = dist();
        let a: Vec<i64> = vec![16, 40];
        let e = PixelSupport::from_pixels(&d, vec![("D00A", &a[..])]).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("40") && text.contains("D00A"), "{text}");
    }

    #[test]
    fn confined_reset_and_covariance_are_the_full_ones_bit_for_bit() {
        use crate::pixels::covariance::apply_covariance;
        use crate::pixels::PixelData;
        use std::sync::Arc;
        // Enough support pixels for several tasks.
        let d = Arc::new(PixelDistribution::new(12 * 4096, 12, &[0, 3, 5, 11]).unwrap());
        let pix: Vec<i64> = (0..3 * TASK_PIXELS as i64)
            .map(|i| [0, 3, 5, 11][(i % 4) as usize] * 4096 + (i * 7) % 4096)
            .collect();
        let support = Arc::new(PixelSupport::from_pixels(&d, vec![("a", &pix[..])]).unwrap());
        let mut cov = PixelData::<f64>::new(Arc::clone(&d), 6);
        for (i, c) in cov.data_mut().chunks_mut(6).enumerate() {
            let x = 1.0 + (i % 13) as f64 / 7.0;
            c.copy_from_slice(&[x, 0.1, -0.2, 2.0 * x, 0.05, 3.0 * x]);
        }
        let mut full = PixelData::<f64>::new(Arc::clone(&d), 3);
        let mut confined = full.clone();
        confined.confine_to(Arc::clone(&support)).unwrap();
        for round in 0..2 {
            for m in [&mut full, &mut confined] {
                m.reset();
                // An accumulation over the support's samples (with -0s).
                for (k, &p) in pix.iter().enumerate() {
                    let i = d.local_index(p).unwrap();
                    let v = &mut m.data_mut()[3 * i..3 * i + 3];
                    let x = if k % 5 == 0 {
                        -0.0
                    } else {
                        (k + round) as f64 * 0.25
                    };
                    v.iter_mut().for_each(|y| *y += x);
                }
                apply_covariance(&cov, m).unwrap();
            }
            let bits =
                |m: &PixelData<f64>| m.data().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&full), bits(&confined), "round {round}");
        }
        confined.reset();
        assert!(confined.data().iter().all(|x| x.to_bits() == 0));
        // A support for another distribution is refused.
        let other = Arc::new(PixelDistribution::new(12 * 4096, 12, &[0]).unwrap());
        let s2 = Arc::new(PixelSupport::from_pixels(&other, vec![("b", &[1i64][..])]).unwrap());
        assert!(full.confine_to(s2).is_err());
    }

    #[test]
    fn pieces_cover_exactly_the_support_pixels() {
        let support: Vec<u32> = (0..3 * TASK_PIXELS as u32 + 5).map(|i| 3 * i + 1).collect();
        let n = 3 * support.len() + 10;
        let mut values = vec![0u32; 2 * n];
        let pieces = split_by_support(&mut values, 2, &support);
        assert_eq!(pieces.len(), 4);
        for (task, lo, piece) in pieces {
            for &p in task {
                let off = (p as usize - lo) * 2;
                piece[off] += p;
                piece[off + 1] += 1;
            }
        }
        for (i, v) in values.chunks(2).enumerate() {
            let listed = support.binary_search(&(i as u32)).is_ok();
            assert_eq!(v, if listed { [i as u32, 1] } else { [0, 0] }, "pixel {i}");
        }
    }
}
