//! The kernel entries of the function table.

use toast_accel::abi;

type Entry<A> = Option<unsafe extern "C" fn(*mut std::ffi::c_void, *const A) -> abi::Status>;

pub(crate) const POINTING_DETECTOR: Entry<abi::PointingDetectorArgs> = None;
pub(crate) const PIXELS_HEALPIX: Entry<abi::PixelsHealpixArgs> = None;
pub(crate) const STOKES_WEIGHTS_I: Entry<abi::StokesWeightsIArgs> = None;
pub(crate) const STOKES_WEIGHTS_IQU: Entry<abi::StokesWeightsIquArgs> = None;
pub(crate) const SCAN_MAP: Entry<abi::ScanMapArgs> = None;
pub(crate) const BUILD_NOISE_WEIGHTED: Entry<abi::BuildNoiseWeightedArgs> = None;
pub(crate) const NOISE_WEIGHT: Entry<abi::NoiseWeightArgs> = None;
pub(crate) const TEMPLATE_OFFSET_ADD: Entry<abi::TemplateOffsetAddArgs> = None;
pub(crate) const TEMPLATE_OFFSET_PROJECT: Entry<abi::TemplateOffsetProjectArgs> = None;
pub(crate) const TEMPLATE_OFFSET_PRECOND: Entry<abi::TemplateOffsetPrecondArgs> = None;
