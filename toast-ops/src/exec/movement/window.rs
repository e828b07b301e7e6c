//! Row windows: the device copy of a detector field that holds only the
//! rows of the detectors a pass processes (a *streamed* scope).
//!
//! In a scope that streams its detector data ([`super::stream_detector_data`]),
//! the device buffer of each observation's detdata field holds a
//! contiguous range of its rows: those of the detectors of the device step
//! being staged (the pipeline's detector set). The host field stays whole.
//! When a step runs on another set, the window moves: the old rows go back
//! to the host if the device wrote them, the buffer is freed, and one of the
//! new window's size receives the new rows (a memset where they are zeros).
//! The rows outside the window are therefore always current on the host,
//! and the device never holds more of a field than one pass's detectors:
//! its resident set is the maps, the boresight and one batch, whatever the
//! length of the timestream, for a bus cost of the batch's rows per pass.
//!
//! Kernel calls of a device step see a windowed field as the window's rows
//! alone: the row of a detector is counted from the window's first row
//! (`exec::kernels`' `rows`), and the array a call gets (the device buffer,
//! or the host's rows when a dispatch override sends the call elsewhere)
//! is the window's bytes. A detector outside the window is an error naming
//! the field, never a read out of bounds.

use std::ops::Range;
use toast_core::{Observation, OpError};

/// The rows of a detdata field one device buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowWindow {
    /// The first row.
    pub first: usize,
    /// Rows held.
    pub rows: usize,
    /// Bytes a row.
    pub row_bytes: usize,
    /// Rows of the host field the window was cut from (a transient field
    /// remade with another size is another field: its old window's rows
    /// are not copied back into it).
    pub field_rows: usize,
}

impl RowWindow {
    /// The window's bytes in the host field.
    pub fn bytes(&self) -> Range<usize> {
        self.first * self.row_bytes..(self.first + self.rows) * self.row_bytes
    }

    /// The window of `ob`'s detdata field `field` that holds the rows of
    /// `detectors` (every row with `None`; the rows from the first to the
    /// last of them, so a set that is not contiguous still fits; no row
    /// when the field holds none of them, as on a process that holds none
    /// of a pass's detectors), or `None` for a field of no rows.
    pub fn of_detectors(
        ob: &Observation,
        field: &str,
        detectors: Option<&[String]>,
    ) -> Result<Option<RowWindow>, OpError> {
        let f = ob.detdata.get(field)?;
        let n = f.n_det();
        if n == 0 {
            return Ok(None);
        }
        let row_bytes = f.as_bytes().len() / n;
        let (first, last) = match detectors {
            None => (0, n - 1),
            Some(dets) => {
                let mut rows = dets.iter().filter_map(|d| f.row_index(d));
                let Some(r) = rows.next() else {
                    return Ok(Some(RowWindow {
                        first: 0,
                        rows: 0,
                        row_bytes,
                        field_rows: n,
                    }));
                };
                rows.fold((r, r), |(lo, hi), r| (lo.min(r), hi.max(r)))
            }
        };
        Ok(Some(RowWindow {
            first,
            rows: last - first + 1,
            row_bytes,
            field_rows: n,
        }))
    }

    /// The window's bytes in a host field of `len` bytes, or `None` when
    /// the field is no longer the one the window was cut from (remade with
    /// another size since).
    pub fn range_in(&self, len: usize) -> Option<Range<usize>> {
        (self.field_rows * self.row_bytes == len && self.bytes().end <= len).then(|| self.bytes())
    }

    /// The window of every row of a field of `n_rows` rows of `row_bytes`.
    pub fn whole(n_rows: usize, row_bytes: usize) -> RowWindow {
        RowWindow {
            first: 0,
            rows: n_rows,
            row_bytes,
            field_rows: n_rows,
        }
    }
}

/// The bytes of a host field of `len` bytes that a device buffer mirrors:
/// `window`'s, or all of them without one. A window of a field remade
/// since it was cut (another size) is an error naming `what`.
pub fn host_range(
    window: Option<&RowWindow>,
    len: usize,
    what: &dyn std::fmt::Display,
) -> Result<Range<usize>, OpError> {
    match window {
        None => Ok(0..len),
        Some(w) => w.range_in(len).ok_or_else(|| OpError::InvalidData {
            what: format!(
                "the device rows {}..{} of {what} no longer match its host field ({len} bytes): \
                 the field was remade while its window was staged",
                w.first,
                w.first + w.rows
            ),
        }),
    }
}

/// The row of `absolute` counted from the window's first, or an error
/// naming the field when the window does not hold it.
pub fn row_in(
    window: &RowWindow,
    absolute: usize,
    observation: &str,
    field: &str,
    detector: &str,
) -> Result<usize, OpError> {
    absolute
        .checked_sub(window.first)
        .filter(|&r| r < window.rows)
        .ok_or_else(|| OpError::InvalidData {
            what: format!(
                "observation '{observation}': detector '{detector}' of detdata '{field}' is not \
                 among the rows {}..{} staged on the device for this step (a kernel call of a \
                 streamed scope outside its pass's detectors)",
                window.first,
                window.first + window.rows
            ),
        })
}
