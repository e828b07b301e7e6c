//! Generates the satellite benchmark's synthetic input sky, writes it as a
//! healpy-compatible FITS file (and optionally a Mollweide PNG), and prints
//! timings and statistics.
//!
//! ```text
//! cargo run --release -p toast-ops --example benchmark_sky -- [NSIDE] [OUT_DIR] [--png] [--toast-ordering] [--lmax=N]
//! ```
//!
//! `--toast-ordering` reproduces TOAST 3.0.6's RING-data-labelled-NESTED file.

use std::path::PathBuf;
use std::time::Instant;

use toast_ops::io::fits::{write_healpix_map, ColumnFormat, ColumnSource, Ordering, WriteColumn};
use toast_ops::math::healpix::Nside;
use toast_ops::sim::sky::{mean_and_rms, synthesize_sky, SkyConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let png = args.iter().any(|a| a == "--png");
    let pos: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let nside: u64 = pos.first().map(|s| s.parse()).transpose()?.unwrap_or(1024);
    let nside = Nside::new(nside)?;
    let out = PathBuf::from(pos.get(1).map(|s| s.as_str()).unwrap_or("."));
    let cfg = SkyConfig {
        nside,
        toast_ring_as_nest: args.iter().any(|a| a == "--toast-ordering"),
        lmax: args
            .iter()
            .find_map(|a| a.strip_prefix("--lmax="))
            .map(str::parse)
            .transpose()?,
        ..SkyConfig::default()
    };
    println!("threads: {}", rayon::current_num_threads());
    let t0 = Instant::now();
    let sky = synthesize_sky(&cfg)?;
    let dt = t0.elapsed().as_secs_f64();
    let tr = sky.truncation;
    println!(
        "synthesized nside {nside} sky in {dt:.2} s (lmax_T {}, lmax_P {}, healpy lmax {}, lost variance I {:.1e} P {:.1e})",
        tr.lmax_t, tr.lmax_p, tr.lmax_full, tr.lost_variance_fraction.0, tr.lost_variance_fraction.1
    );
    println!(
        "expected RMS (full band): I {:.4} Q {:.4} U {:.4}",
        tr.expected_rms_full.0, tr.expected_rms_full.1, tr.expected_rms_full.2
    );
    for (name, m) in [("I", &sky.i), ("Q", &sky.q), ("U", &sky.u)] {
        let (mean, rms) = mean_and_rms(m);
        println!("{name}: mean {mean:.6} rms {rms:.6}");
    }
    let path = out.join(format!("rs_input_sky_nside{nside}.fits"));
    let t1 = Instant::now();
    let cols: Vec<WriteColumn<'_>> = [
        ("TEMPERATURE", &sky.i),
        ("Q_POLARISATION", &sky.q),
        ("U_POLARISATION", &sky.u),
    ]
    .into_iter()
    .map(|(name, d)| WriteColumn {
        name,
        unit: Some("K"),
        format: ColumnFormat::F32,
        data: ColumnSource::F32(d),
    })
    .collect();
    write_healpix_map(&path, Ordering::Nested, &cols, &[])?;
    println!(
        "wrote {} in {:.2} s",
        path.display(),
        t1.elapsed().as_secs_f64()
    );
    if png {
        let p = out.join(format!("rs_input_sky_nside{nside}.png"));
        let t2 = Instant::now();
        toast_ops::io::plot::plot_iqu_mollweide(
            &p,
            nside.get(),
            [&sky.i, &sky.q, &sky.u],
            None,
            800,
        )?;
        println!(
            "wrote {} in {:.2} s",
            p.display(),
            t2.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
