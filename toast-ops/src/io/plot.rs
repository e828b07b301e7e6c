//! Mollweide-projection PNG images of HEALPix I/Q/U maps.
//!
//! # Projection
//!
//! The Mollweide projection maps the sphere onto an ellipse with a 2:1 axis
//! ratio. For an image point with normalised coordinates `(u, v)` in the unit
//! disk (`u` right, `v` up), the auxiliary angle `α = asin v` gives the
//! latitude `b = asin((2α + sin 2α)/π)` and longitude `l = −π u / cos α`.
//! The sign of `l` follows healpy's `mollview` default (`flip='astro'`): the
//! longitude increases to the **left**, `φ = 0` at the centre. Each image pixel
//! samples the NEST map pixel containing `(θ = π/2 − b, φ = l mod 2π)`.
//!
//! # Colours
//!
//! A diverging blue–white–red map (ColorBrewer RdBu, reversed, as matplotlib's
//! `RdBu_r`) over a symmetric range `[−v, v]` with `v = max(|p₁|, |p₉₉|)`, the
//! 1st and 99th percentiles of the hit pixels; values outside are clipped.
//! Unhit pixels are grey, the area outside the ellipse white. Under each panel
//! a colour bar is drawn, labelled with `−v` and `+v` in a small built-in
//! bitmap font, and the panel's title (`I`, `Q`, `U`) is written at its top
//! left.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use super::fits::MapValue;
use crate::io::fits::{SubmapColumn, UNSEEN};
use crate::math::healpix::{Healpix, HealpixError};

/// Errors of the plotting module.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// Invalid resolution.
    #[error(transparent)]
    Healpix(#[from] HealpixError),
    /// Inconsistent input.
    #[error("cannot plot: {0}")]
    BadInput(String),
    /// File creation failed.
    #[error("{path}: cannot create: {source}")]
    Io {
        /// File path.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// PNG encoding failed.
    #[error("{path}: PNG encoding failed: {source}")]
    Png {
        /// File path.
        path: PathBuf,
        /// Underlying error.
        source: png::EncodingError,
    },
}

/// An RGB8 image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// Row-major RGB triplets.
    pub rgb: Vec<u8>,
}

impl Image {
    fn new(width: usize, height: usize, fill: [u8; 3]) -> Self {
        let mut rgb = Vec::with_capacity(width * height * 3);
        for _ in 0..width * height {
            rgb.extend_from_slice(&fill);
        }
        Self { width, height, rgb }
    }

    /// The colour at `(x, y)`.
    pub fn get(&self, x: usize, y: usize) -> [u8; 3] {
        let i = 3 * (y * self.width + x);
        [self.rgb[i], self.rgb[i + 1], self.rgb[i + 2]]
    }

    fn set(&mut self, x: usize, y: usize, c: [u8; 3]) {
        if x < self.width && y < self.height {
            let i = 3 * (y * self.width + x);
            self.rgb[i..i + 3].copy_from_slice(&c);
        }
    }

    /// Copies `other` with its top-left corner at `(x0, y0)`.
    fn blit(&mut self, other: &Image, x0: usize, y0: usize) {
        for y in 0..other.height {
            for x in 0..other.width {
                self.set(x0 + x, y0 + y, other.get(x, y));
            }
        }
    }

    /// Writes the image as an 8-bit RGB PNG.
    pub fn write_png(&self, path: &Path) -> Result<(), PlotError> {
        let file = File::create(path).map_err(|source| PlotError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let png_err = |source| PlotError::Png {
            path: path.to_path_buf(),
            source,
        };
        let mut enc =
            png::Encoder::new(BufWriter::new(file), self.width as u32, self.height as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().map_err(png_err)?;
        w.write_image_data(&self.rgb).map_err(png_err)?;
        w.finish().map_err(png_err)?;
        Ok(())
    }
}

/// Background (outside the ellipse).
pub const BACKGROUND: [u8; 3] = [255, 255, 255];
/// Colour of unhit pixels.
pub const UNHIT: [u8; 3] = [128, 128, 128];

/// ColorBrewer RdBu reversed (low = blue, high = red), 11 anchors.
const RDBU_R: [[u8; 3]; 11] = [
    [0x05, 0x30, 0x61],
    [0x21, 0x66, 0xac],
    [0x43, 0x93, 0xc3],
    [0x92, 0xc5, 0xde],
    [0xd1, 0xe5, 0xf0],
    [0xf7, 0xf7, 0xf7],
    [0xfd, 0xdb, 0xc7],
    [0xf4, 0xa5, 0x82],
    [0xd6, 0x60, 0x4d],
    [0xb2, 0x18, 0x2b],
    [0x67, 0x00, 0x1f],
];

/// Colour of `t` in `[0, 1]` (clipped) on the diverging colour map.
pub fn colormap(t: f64) -> [u8; 3] {
    let t = if t.is_nan() { 0.5 } else { t.clamp(0.0, 1.0) };
    let x = t * (RDBU_R.len() - 1) as f64;
    let i = (x.floor() as usize).min(RDBU_R.len() - 2);
    let f = x - i as f64;
    let (a, b) = (RDBU_R[i], RDBU_R[i + 1]);
    std::array::from_fn(|k| (a[k] as f64 + f * (b[k] as f64 - a[k] as f64)).round() as u8)
}

/// Whether a pixel value counts as hit when no mask is given: finite and not UNSEEN.
fn default_hit(v: f64) -> bool {
    v.is_finite() && v != UNSEEN
}

/// A full-sky NEST map read pixel by pixel: a slice (a hit mask of `bool`
/// reads as 1 or 0), or a map stored by submaps ([`SubmapColumn`]), which
/// is drawn without a full-sky copy.
pub trait SkyValues: Sync {
    /// Pixels of the full sky.
    fn n_pix(&self) -> usize;
    /// The value of pixel `p < n_pix`.
    fn value(&self, p: usize) -> f64;
}

impl<T: Copy + Into<f64> + Sync> SkyValues for [T] {
    fn n_pix(&self) -> usize {
        self.len()
    }
    #[inline]
    fn value(&self, p: usize) -> f64 {
        self[p].into()
    }
}

impl<T: MapValue> SkyValues for SubmapColumn<'_, T> {
    fn n_pix(&self) -> usize {
        self.n_pix
    }
    #[inline]
    fn value(&self, p: usize) -> f64 {
        self.get(p).to_f64()
    }
}

/// Whether pixel `p` of value `v` is drawn: hit in the mask (a positive
/// value) and finite, or without a mask [`default_hit`].
#[inline]
fn is_hit<H: SkyValues + ?Sized>(hit: Option<&H>, p: usize, v: f64) -> bool {
    match hit {
        Some(h) => h.value(p) > 0.0 && v.is_finite(),
        None => default_hit(v),
    }
}

/// Symmetric colour range `max(|p1|, |p99|)` of the hit pixels (at most ~2M
/// evenly strided samples are used). Returns 0 when nothing is hit.
pub fn symmetric_range<T: Copy + Into<f64> + Sync>(map: &[T], hit: Option<&[bool]>) -> f64 {
    symmetric_range_of(map, hit)
}

/// [`symmetric_range`] of any [`SkyValues`].
pub fn symmetric_range_of<M: SkyValues + ?Sized, H: SkyValues + ?Sized>(
    map: &M,
    hit: Option<&H>,
) -> f64 {
    let stride = (map.n_pix() / 2_000_000).max(1);
    let mut vals: Vec<f64> = (0..map.n_pix())
        .step_by(stride)
        .filter_map(|p| {
            let v = map.value(p);
            is_hit(hit, p, v).then_some(v)
        })
        .collect();
    if vals.is_empty() {
        return 0.0;
    }
    let n = vals.len();
    let k1 = ((n - 1) as f64 * 0.01).round() as usize;
    let k99 = ((n - 1) as f64 * 0.99).round() as usize;
    let p1 = *vals.select_nth_unstable_by(k1, f64::total_cmp).1;
    let p99 = *vals.select_nth_unstable_by(k99, f64::total_cmp).1;
    p1.abs().max(p99.abs())
}

/// Renders one Mollweide panel of a NEST map: `width × width/2` pixels,
/// values mapped on `[−vmax, vmax]`.
pub fn render_mollweide<T: Copy + Into<f64> + Sync>(
    nside: u64,
    map: &[T],
    hit: Option<&[bool]>,
    vmax: f64,
    width: usize,
) -> Result<Image, PlotError> {
    render_mollweide_of(nside, map, hit, vmax, width)
}

/// [`render_mollweide`] of any [`SkyValues`].
pub fn render_mollweide_of<M: SkyValues + ?Sized, H: SkyValues + ?Sized>(
    nside: u64,
    map: &M,
    hit: Option<&H>,
    vmax: f64,
    width: usize,
) -> Result<Image, PlotError> {
    let proj = Projection::new(nside, width)?;
    proj.render(map, hit, vmax)
}

/// The HEALPix NEST pixel under each point of a `width × width/2`
/// Mollweide image (`None` outside the ellipse): computed once and drawn
/// for each of a plot's panels.
struct Projection {
    nside: u64,
    npix: u64,
    width: usize,
    height: usize,
    /// Row-major, `u32::MAX` for the background.
    pixels: Vec<u32>,
}

impl Projection {
    /// Outside the ellipse.
    const OUTSIDE: u32 = u32::MAX;

    fn new(nside: u64, width: usize) -> Result<Self, PlotError> {
        let hp = Healpix::new(nside)?;
        if width < 8 {
            return Err(PlotError::BadInput(format!(
                "image width {width} too small"
            )));
        }
        if hp.npix() >= u64::from(Self::OUTSIDE) {
            return Err(PlotError::BadInput(format!(
                "nside {nside}: too many pixels to plot"
            )));
        }
        let height = width / 2;
        let rows: Vec<Vec<u32>> = (0..height)
            .into_par_iter()
            .map(|y| {
                let v = 1.0 - 2.0 * (y as f64 + 0.5) / height as f64;
                (0..width)
                    .map(|x| {
                        let u = 2.0 * (x as f64 + 0.5) / width as f64 - 1.0;
                        if u * u + v * v > 1.0 {
                            return Self::OUTSIDE;
                        }
                        let alpha = v.asin();
                        let s = ((2.0 * alpha + (2.0 * alpha).sin()) / std::f64::consts::PI)
                            .clamp(-1.0, 1.0);
                        let lat = s.asin();
                        let lon = -std::f64::consts::PI * u / alpha.cos();
                        hp.ang2pix_nest(std::f64::consts::FRAC_PI_2 - lat, lon) as u32
                    })
                    .collect()
            })
            .collect();
        Ok(Projection {
            nside,
            npix: hp.npix(),
            width,
            height,
            pixels: rows.concat(),
        })
    }

    /// One panel: values mapped on `[−vmax, vmax]`.
    fn render<M: SkyValues + ?Sized, H: SkyValues + ?Sized>(
        &self,
        map: &M,
        hit: Option<&H>,
        vmax: f64,
    ) -> Result<Image, PlotError> {
        if map.n_pix() as u64 != self.npix {
            return Err(PlotError::BadInput(format!(
                "map has {} pixels, nside {} needs {}",
                map.n_pix(),
                self.nside,
                self.npix
            )));
        }
        if let Some(h) = hit {
            if h.n_pix() != map.n_pix() {
                return Err(PlotError::BadInput(format!(
                    "hit mask has {} pixels, map has {}",
                    h.n_pix(),
                    map.n_pix()
                )));
            }
        }
        let scale = if vmax > 0.0 { vmax } else { 1.0 };
        let mut rgb = vec![0u8; self.pixels.len() * 3];
        rgb.par_chunks_mut(3 * self.width)
            .zip(self.pixels.par_chunks(self.width))
            .for_each(|(row, pix)| {
                for (c, &p) in row.chunks_exact_mut(3).zip(pix) {
                    c.copy_from_slice(&if p == Self::OUTSIDE {
                        BACKGROUND
                    } else {
                        let p = p as usize;
                        let val = map.value(p);
                        if is_hit(hit, p, val) {
                            colormap(0.5 + 0.5 * val / scale)
                        } else {
                            UNHIT
                        }
                    });
                }
            });
        Ok(Image {
            width: self.width,
            height: self.height,
            rgb,
        })
    }
}

/// 5×7 bitmap glyphs (rows top to bottom, 5 low bits, MSB left).
fn glyph(c: char) -> Option<[u8; 7]> {
    Some(match c {
        '0' => [0x0e, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0e],
        '1' => [0x04, 0x0c, 0x04, 0x04, 0x04, 0x04, 0x0e],
        '2' => [0x0e, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1f],
        '3' => [0x1f, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0e],
        '4' => [0x02, 0x06, 0x0a, 0x12, 0x1f, 0x02, 0x02],
        '5' => [0x1f, 0x10, 0x1e, 0x01, 0x01, 0x11, 0x0e],
        '6' => [0x06, 0x08, 0x10, 0x1e, 0x11, 0x11, 0x0e],
        '7' => [0x1f, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0e, 0x11, 0x11, 0x0e, 0x11, 0x11, 0x0e],
        '9' => [0x0e, 0x11, 0x11, 0x0f, 0x01, 0x02, 0x0c],
        '.' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x0c, 0x0c],
        '-' => [0x00, 0x00, 0x00, 0x1f, 0x00, 0x00, 0x00],
        '+' => [0x00, 0x04, 0x04, 0x1f, 0x04, 0x04, 0x00],
        'e' => [0x00, 0x00, 0x0e, 0x11, 0x1f, 0x10, 0x0e],
        'I' => [0x0e, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0e],
        'Q' => [0x0e, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0d],
        'U' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0e],
        'K' => [0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11],
        ' ' => [0; 7],
        _ => return None,
    })
}

/// Draws `text` (unknown characters are skipped) with its top-left corner at
/// `(x0, y0)`, each font pixel `scale × scale` image pixels.
fn draw_text(img: &mut Image, text: &str, x0: usize, y0: usize, scale: usize, color: [u8; 3]) {
    let mut x = x0;
    for c in text.chars() {
        if let Some(g) = glyph(c) {
            for (r, bits) in g.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        for dy in 0..scale {
                            for dx in 0..scale {
                                img.set(x + col * scale + dx, y0 + r * scale + dy, color);
                            }
                        }
                    }
                }
            }
            x += 6 * scale;
        }
    }
}

fn text_width(text: &str, scale: usize) -> usize {
    text.chars().filter(|&c| glyph(c).is_some()).count() * 6 * scale
}

/// Compact numeric label: 4 significant digits.
fn label(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e5).contains(&a) {
        format!("{v:.3e}")
    } else {
        let digits = if a == 0.0 {
            0
        } else {
            (3 - a.log10().floor() as i32).max(0) as usize
        };
        format!("{v:.digits$}")
    }
}

/// Renders the three maps as stacked Mollweide panels (each `width` wide,
/// with a title and a labelled colour bar) and returns the image. Each panel
/// has its own symmetric range from the 1st/99th percentiles of its hit pixels.
pub fn render_iqu<T: Copy + Into<f64> + Sync>(
    nside: u64,
    maps: [&[T]; 3],
    hit: Option<&[bool]>,
    width: usize,
) -> Result<Image, PlotError> {
    render_iqu_of(nside, maps, hit, width)
}

/// [`render_iqu`] of any [`SkyValues`]: a map stored by submaps
/// ([`SubmapColumn`], e.g. `PixelData::column`) is read in place, with no
/// full-sky copy of a component or of the hit mask.
pub fn render_iqu_of<M: SkyValues + ?Sized, H: SkyValues + ?Sized>(
    nside: u64,
    maps: [&M; 3],
    hit: Option<&H>,
    width: usize,
) -> Result<Image, PlotError> {
    let scale = (width / 400).max(1);
    let pad = 6 * scale;
    let title_h = 7 * scale + 2 * pad;
    let bar_h = 5 * scale + 2;
    let label_h = 7 * scale + pad;
    let panel_h = title_h + width / 2 + pad + bar_h + label_h + pad;
    let mut img = Image::new(width, 3 * panel_h, BACKGROUND);
    let proj = Projection::new(nside, width)?;
    for (i, name) in ["I", "Q", "U"].iter().enumerate() {
        let y0 = i * panel_h;
        let map = maps[i];
        let vmax = symmetric_range_of(map, hit);
        let panel = proj.render(map, hit, vmax)?;
        draw_text(&mut img, name, pad, y0 + pad, scale, [0, 0, 0]);
        img.blit(&panel, 0, y0 + title_h);
        // Colour bar over the middle 60% of the width.
        let bx0 = width / 5;
        let bw = width * 3 / 5;
        let by0 = y0 + title_h + width / 2 + pad;
        for x in 0..bw {
            let c = colormap((x as f64 + 0.5) / bw as f64);
            for y in 0..bar_h {
                let edge = y == 0 || y == bar_h - 1;
                img.set(bx0 + x, by0 + y, if edge { [0, 0, 0] } else { c });
            }
        }
        for y in 0..bar_h {
            img.set(bx0, by0 + y, [0, 0, 0]);
            img.set(bx0 + bw - 1, by0 + y, [0, 0, 0]);
        }
        let lo = label(-vmax);
        let hi = label(vmax);
        let ly = by0 + bar_h + scale * 2;
        let lw = text_width(&lo, scale);
        draw_text(
            &mut img,
            &lo,
            bx0.saturating_sub(lw / 2),
            ly,
            scale,
            [0, 0, 0],
        );
        let hw = text_width(&hi, scale);
        draw_text(
            &mut img,
            &hi,
            (bx0 + bw).saturating_sub(hw / 2),
            ly,
            scale,
            [0, 0, 0],
        );
        draw_text(&mut img, "K", bx0 + bw + hw / 2 + pad, ly, scale, [0, 0, 0]);
    }
    Ok(img)
}

/// Writes a PNG with the I, Q, U maps (NEST order) as three stacked
/// Mollweide panels `width` pixels wide (see [`render_iqu`]). `hit` marks the
/// observed pixels (`None`: every finite, non-UNSEEN pixel).
pub fn plot_iqu_mollweide<T: Copy + Into<f64> + Sync>(
    path: &Path,
    nside: u64,
    maps: [&[T]; 3],
    hit: Option<&[bool]>,
    width: usize,
) -> Result<(), PlotError> {
    render_iqu(nside, maps, hit, width)?.write_png(path)
}

/// [`plot_iqu_mollweide`] of any [`SkyValues`] (see [`render_iqu_of`]).
pub fn plot_iqu_mollweide_of<M: SkyValues + ?Sized, H: SkyValues + ?Sized>(
    path: &Path,
    nside: u64,
    maps: [&M; 3],
    hit: Option<&H>,
    width: usize,
) -> Result<(), PlotError> {
    render_iqu_of(nside, maps, hit, width)?.write_png(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colormap_ends_and_middle() {
        assert_eq!(colormap(0.0), RDBU_R[0]);
        assert_eq!(colormap(1.0), RDBU_R[10]);
        assert_eq!(colormap(0.5), RDBU_R[5]);
        assert_eq!(colormap(-3.0), RDBU_R[0]);
        assert_eq!(colormap(f64::NAN), RDBU_R[5]);
    }

    #[test]
    fn percentile_range() {
        let m: Vec<f64> = (0..1001).map(|i| i as f64 - 500.0).collect();
        assert_eq!(symmetric_range(&m, None), 490.0);
        let hit: Vec<bool> = (0..1001).map(|i| i > 500).collect();
        assert_eq!(symmetric_range(&m, Some(&hit)), 495.0);
        assert_eq!(symmetric_range(&[UNSEEN; 4], None), 0.0);
    }

    #[test]
    fn projection_orientation() {
        let nside = 16;
        let hp = Healpix::new(nside).unwrap();
        // North positive: top red, bottom blue.
        let z: Vec<f64> = (0..hp.npix()).map(|p| hp.pix2vec_nest(p)[2]).collect();
        let img = render_mollweide(nside, &z, None, 1.0, 200).unwrap();
        assert_eq!(img.get(0, 0), BACKGROUND);
        assert_eq!(img.get(199, 99), BACKGROUND);
        let top = img.get(100, 3);
        let bottom = img.get(100, 96);
        assert!(top[0] as i32 > top[2] as i32 + 50, "{top:?}");
        assert!(bottom[2] as i32 > bottom[0] as i32 + 50, "{bottom:?}");
        // y = sinθ sinφ is +1 at φ = 90°: on the left (astro convention).
        let yv: Vec<f64> = (0..hp.npix()).map(|p| hp.pix2vec_nest(p)[1]).collect();
        let img = render_mollweide(nside, &yv, None, 1.0, 200).unwrap();
        let left = img.get(50, 50);
        let right = img.get(150, 50);
        assert!(left[0] as i32 > left[2] as i32 + 50, "{left:?}");
        assert!(right[2] as i32 > right[0] as i32 + 50, "{right:?}");
        // Unhit pixels grey.
        let hit = vec![false; hp.npix() as usize];
        let img = render_mollweide(nside, &z, Some(&hit), 1.0, 200).unwrap();
        assert_eq!(img.get(100, 50), UNHIT);
        assert!(render_mollweide(nside, &z[1..], None, 1.0, 200).is_err());
    }

    #[test]
    fn labels() {
        assert_eq!(label(312.456), "312.5");
        assert_eq!(label(-0.5), "-0.5000");
        assert_eq!(label(2.5e-5), "2.500e-5");
        assert_eq!(label(0.0), "0");
    }
}
