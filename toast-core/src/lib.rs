//! toast-core: observation data, intervals, operator traits and the
//! accelerator buffer abstraction.

pub mod device;
