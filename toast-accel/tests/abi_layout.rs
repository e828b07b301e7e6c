//! The Rust mirror (`src/abi.rs`) against the C header
//! (`include/toast_backend.h`), as the C compiler lays it out.
//!
//! The test reads the header, finds every struct and field and every
//! `TOAST_*` constant in it, writes a C program that prints their sizes,
//! alignments, offsets and values, compiles and runs it with the system C
//! compiler (`$CC`, else `cc`), and compares each line with the Rust side.
//! A struct, field or constant present on one side only is a failure, so a
//! field added to the header without its mirror (or to this test) is caught.
//!
//! A C compiler is required; without one the test fails and says so.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::mem::{align_of, offset_of, size_of};
use std::path::Path;
use std::process::Command;
use toast_accel::abi::*;

const HEADER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/include/toast_backend.h");

/// Layout of one struct: size, alignment and field offsets.
#[derive(Debug, Default, PartialEq, Eq)]
struct Layout {
    size: usize,
    align: usize,
    fields: BTreeMap<String, usize>,
}

/// The Rust layouts, keyed by the C struct name.
macro_rules! rust_layouts {
    ($($c:ident => $r:ty { $($f:ident),* $(,)? }),* $(,)?) => {{
        let mut m: BTreeMap<String, Layout> = BTreeMap::new();
        $(
            m.insert(
                stringify!($c).to_string(),
                Layout {
                    size: size_of::<$r>(),
                    align: align_of::<$r>(),
                    fields: BTreeMap::from([$((stringify!($f).to_string(), offset_of!($r, $f))),*]),
                },
            );
        )*
        m
    }};
}

fn rust_side() -> BTreeMap<String, Layout> {
    let mut m = rust_layouts! {
        toast_host_api => HostApi { size, abi_minor, log, log_user, options },
        toast_array => Array { ptr, len },
        toast_interval => SampleRange { first, last },
        toast_intervals => SampleRanges { ptr, len },
        toast_device_info => DeviceInfo {
            name, total_memory, free_memory, compute_units, peak_held_mib, memory_kind, reserved,
            uuid,
        },
        toast_pointing_detector_args => PointingDetectorArgs {
            n_det, n_samp, quat_index, focalplane, intervals, boresight, shared_flags,
            shared_flag_mask, reserved, quats,
        },
        toast_pixels_healpix_args => PixelsHealpixArgs {
            n_det, n_samp, quat_index, pixel_index, intervals, quats, shared_flags, pixels,
            hit_submaps, nside, n_pix_submap, shared_flag_mask, nest, pixels_i32, reserved,
        },
        toast_stokes_weights_i_args => StokesWeightsIArgs {
            n_det, n_samp, weight_index, cal, intervals, weights,
        },
        toast_stokes_weights_iqu_args => StokesWeightsIquArgs {
            n_det, n_samp, quat_index, weight_index, epsilon, gamma, cal, intervals, quats, hwp,
            weights, iau, reserved,
        },
        toast_scan_map_args => ScanMapArgs {
            n_det, n_samp, nnz, pixel_index, weight_index, data_index, intervals, global2local,
            n_pix_submap, map_dtype, reserved0, mapdata, pixels, weights, det_data, data_scale,
            should_zero, should_subtract, should_scale, reserved,
        },
        toast_build_noise_weighted_args => BuildNoiseWeightedArgs {
            n_det, n_samp, nnz, pixel_index, weight_index, data_index, flag_index, det_scale,
            intervals, global2local, n_pix_submap, pixels, weights, det_data, det_flags,
            shared_flags, zmap, det_flag_mask, shared_flag_mask, reserved,
        },
        toast_noise_weight_args => NoiseWeightArgs {
            n_det, n_samp, data_index, detector_weights, intervals, det_data,
        },
        toast_offset_layout => OffsetLayout { step_length, n_amp_views, amp_offset },
        toast_template_offset_add_args => TemplateOffsetAddArgs {
            n_det, n_samp, data_index, layout, intervals, amplitudes, amplitude_flags, det_data,
        },
        toast_template_offset_project_args => TemplateOffsetProjectArgs {
            n_det, n_samp, data_index, flag_index, layout, intervals, det_data, flag_data,
            amplitudes, amplitude_flags, flag_mask, reserved,
        },
        toast_template_offset_precond_args => TemplateOffsetPrecondArgs {
            n_amp, offset_var, amplitudes_in, amplitude_flags, amplitudes_out,
        },
        toast_cov_accum_diag_hits_args => CovAccumDiagHitsArgs {
            nsub, nsubpix, nnz, submap, subpix, hits,
        },
        toast_cov_accum_diag_invnpp_args => CovAccumDiagInvnppArgs {
            nsub, nsubpix, nnz, submap, subpix, weights, scale, invnpp,
        },
        toast_filter_polynomial_args => FilterPolynomialArgs {
            n_signal, n_samp, n_scan, order, signal_index, starts, stops, flags, signals,
        },
        toast_filter_poly2d_args => FilterPoly2dArgs {
            n_samp, n_det, n_group, n_mode, det_groups, templates, signals, masks, coeff,
        },
        toast_cov_apply_diag_args => CovApplyDiagArgs { nsub, nsubpix, nnz, mat, vec },
        toast_amp_dot_args => AmpDotArgs { n, nblock, a, b, flags, partials },
        toast_amp_axpby_args => AmpAxpbyArgs { n, alpha, beta, x, y },
        toast_compact_expand_pointing_args => CompactExpandPointingArgs {
            n_det, n_samp, nnz, compact_index, pixel_index, weight_index, focalplane, epsilon,
            gamma, cal, intervals, compact, boresight, pointing_flags, hwp, pixels, weights,
            out_first, out_n_samp, pointing_flag_mask, iau, reserved,
        },
        toast_fused_accumulate_args => FusedAccumulateArgs {
            n_det, n_samp, pixel_index, weight_index, focalplane, epsilon, gamma, cal,
            data_index, flag_index, det_scale, finite, layout, intervals, global2local,
            n_pix_submap, compact, boresight, pointing_flags, hwp, pixels, weights, det_data,
            det_flags, shared_flags, amplitudes, amplitude_flags, zmap, det_flag_mask,
            shared_flag_mask, pointing_flag_mask, iau, reserved,
        },
        toast_fused_project_args => FusedProjectArgs {
            n_det, n_samp, pixel_index, weight_index, focalplane, epsilon, gamma, cal,
            data_index, flag_index, det_scale, layout, intervals, global2local,
            n_pix_submap, compact, boresight, pointing_flags, hwp, pixels, weights, det_data,
            det_flags, mapdata, amplitudes, amplitude_flags, amplitudes_out, det_flag_mask,
            pointing_flag_mask, iau, reserved,
        },
        toast_sim_noise_args => SimNoiseArgs {
            n_det, n_samp, fft_len, n_filter, counter0, data_index, filter_index, keys,
            amplitudes, det_data,
        },
        toast_cov_accum_timestream_args => CovAccumTimestreamArgs {
            n_det, n_samp, nnz, pixel_index, weight_index, flag_index, det_scale, intervals,
            global2local, n_pix_submap, pixels, weights, det_flags, shared_flags, hits, invnpp,
            det_flag_mask, shared_flag_mask, reserved,
        },
        toast_solver_flags_args => SolverFlagsArgs {
            n_det, n_samp, flag_index, pixel_index, out_index, intervals, global2local,
            n_pix_submap, det_flags, shared_flags, pixels, pixel_mask, flags, counts,
            det_flag_mask, shared_flag_mask, cut_bit, mask_bit, reserved,
        },
        toast_backend_table => BackendTable {
            init, shutdown, last_error, device_count, device_info, alloc, free, copy_to_device,
            copy_to_host, reset, synchronize,
        },
        toast_backend_header => BackendHeader {
            magic, abi_major, abi_minor, table_size, flags, name, version, description, table,
        },
    };
    // The kernel slots of the function table come from the kernel table.
    let table = m.get_mut("toast_backend_table").unwrap();
    for k in Kernel::ALL {
        table.fields.insert(k.slot().to_string(), k.slot_offset());
    }
    m
}

/// The Rust values of the header's constants, keyed by the C name, printed
/// as the C program prints them.
fn rust_constants() -> BTreeMap<String, String> {
    let n = |v: i64| v.to_string();
    [
        ("TOAST_BACKEND_MAGIC", MAGIC.to_string()),
        ("TOAST_BACKEND_ABI_MAJOR", n(ABI_MAJOR.into())),
        ("TOAST_BACKEND_ABI_MINOR", n(ABI_MINOR.into())),
        ("TOAST_BACKEND_ENTRY_SYMBOL", ENTRY_SYMBOL.to_string()),
        ("TOAST_OK", n(OK.into())),
        ("TOAST_ERR_INVALID_ARGUMENT", n(ERR_INVALID_ARGUMENT.into())),
        ("TOAST_ERR_OUT_OF_MEMORY", n(ERR_OUT_OF_MEMORY.into())),
        ("TOAST_ERR_UNSUPPORTED", n(ERR_UNSUPPORTED.into())),
        ("TOAST_ERR_INVALID_HANDLE", n(ERR_INVALID_HANDLE.into())),
        ("TOAST_ERR_DEVICE", n(ERR_DEVICE.into())),
        ("TOAST_ERR_UNAVAILABLE", n(ERR_UNAVAILABLE.into())),
        ("TOAST_ERR_COMPILE", n(ERR_COMPILE.into())),
        ("TOAST_ERR_PANIC", n(ERR_PANIC.into())),
        ("TOAST_ERR_INTERNAL", n(ERR_INTERNAL.into())),
        ("TOAST_LOG_ERROR", n(LOG_ERROR.into())),
        ("TOAST_LOG_WARN", n(LOG_WARN.into())),
        ("TOAST_LOG_INFO", n(LOG_INFO.into())),
        ("TOAST_LOG_DEBUG", n(LOG_DEBUG.into())),
        ("TOAST_LOG_TRACE", n(LOG_TRACE.into())),
        ("TOAST_DTYPE_F64", n(DTYPE_F64.into())),
        ("TOAST_DTYPE_F32", n(DTYPE_F32.into())),
        ("TOAST_DTYPE_I64", n(DTYPE_I64.into())),
        ("TOAST_DTYPE_I32", n(DTYPE_I32.into())),
        (
            "TOAST_DEVICE_MEMORY_UNKNOWN",
            n(DEVICE_MEMORY_UNKNOWN.into()),
        ),
        ("TOAST_DEVICE_MEMORY_OWN", n(DEVICE_MEMORY_OWN.into())),
        ("TOAST_DEVICE_MEMORY_HOST", n(DEVICE_MEMORY_HOST.into())),
        (
            "TOAST_BACKEND_FLAG_HOST_ADDRESSABLE",
            n(FLAG_HOST_ADDRESSABLE.into()),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .chain(DEVICE_INFO_SIZE_MINORS.map(|m| {
        (
            format!("TOAST_DEVICE_INFO_SIZE({m})"),
            DeviceInfo::size_for_host(m).to_string(),
        )
    }))
    .collect()
}

/// Host minors at which `TOAST_DEVICE_INFO_SIZE` and
/// `DeviceInfo::size_for_host` are compared (before, at and after minors 9 and 10).
const DEVICE_INFO_SIZE_MINORS: [u32; 5] = [0, 8, 9, 10, 11];

/// Scalar typedefs of the header whose size the Rust side fixes.
fn rust_typedef_sizes() -> BTreeMap<String, usize> {
    BTreeMap::from([
        ("toast_status".to_string(), size_of::<Status>()),
        ("toast_log_fn".to_string(), size_of::<LogFn>()),
        (
            "toast_backend_entry_fn".to_string(),
            size_of::<Option<EntryFn>>(),
        ),
    ])
}

/// The header without comments.
fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    loop {
        let block = rest.find("/*");
        let line = rest.find("//");
        match (block, line) {
            (Some(b), l) if l.is_none_or(|l| b < l) => {
                out.push_str(&rest[..b]);
                let end = rest[b + 2..].find("*/").expect("unterminated comment") + b + 4;
                out.push(' ');
                rest = &rest[end..];
            }
            (_, Some(l)) => {
                out.push_str(&rest[..l]);
                rest = &rest[l..];
                rest = &rest[rest.find('\n').unwrap_or(rest.len())..];
            }
            (None, None) => {
                out.push_str(rest);
                return out;
            }
            (Some(_), None) => unreachable!(),
        }
    }
}

/// Every `typedef struct NAME { ... } NAME;` of the header: name and fields.
fn header_structs(src: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find("typedef struct ") {
        rest = &rest[i + "typedef struct ".len()..];
        let open = rest.find('{').expect("struct body");
        let name = rest[..open].trim().to_string();
        let close = rest.find('}').expect("end of struct body");
        let body = &rest[open + 1..close];
        let mut fields = Vec::new();
        for decl in body.split(';').map(str::trim).filter(|d| !d.is_empty()) {
            let field = if let Some(p) = decl.find("(*") {
                let after = &decl[p + 2..];
                after[..after.find(')').expect("function pointer field")].trim()
            } else {
                let no_array = decl.split('[').next().unwrap();
                no_array
                    .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .find(|w| !w.is_empty())
                    .expect("field name")
            };
            fields.push(field.to_string());
        }
        let after = rest[close + 1..].trim_start();
        let alias = &after[..after.find(';').expect("typedef name")];
        assert_eq!(
            alias.trim(),
            name,
            "typedef struct {name} is named differently"
        );
        out.push((name, fields));
        rest = &rest[close + 1..];
    }
    out
}

/// Every `#define TOAST_* value` of the header: name and whether it is a
/// string (function-like macros, `TOAST_X(m)`, are not constants).
fn header_constants(src: &str) -> Vec<(String, bool)> {
    src.lines()
        .filter_map(|l| l.trim().strip_prefix("#define "))
        .filter_map(|d| {
            let mut parts = d.trim().splitn(2, char::is_whitespace);
            let name = parts.next()?;
            let value = parts.next()?.trim();
            (name.starts_with("TOAST_") && !name.contains('(') && !value.is_empty())
                .then(|| (name.to_string(), value.starts_with('"')))
        })
        .collect()
}

fn compiler() -> (OsString, Vec<OsString>) {
    let cc = std::env::var("CC")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "cc".to_string());
    let mut words = cc.split_whitespace().map(OsString::from);
    let program = words.next().expect("non-empty compiler command");
    (program, words.collect())
}

/// Compile and run `program`, returning its standard output.
fn compile_and_run(program: &str) -> String {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("abi_layout");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join(if cfg!(windows) {
        "layout.exe"
    } else {
        "layout"
    });
    std::fs::write(&src, program).unwrap();
    let (cc, cc_args) = compiler();
    let mut cmd = Command::new(&cc);
    cmd.args(&cc_args)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(Path::new(HEADER).parent().unwrap())
        .arg("-o")
        .arg(&exe)
        .arg(&src);
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run the C compiler {cc:?} ({e}); the ABI layout test needs one: install gcc \
             or clang, or set CC"
        )
    });
    assert!(
        out.status.success(),
        "compiling the layout program failed: {cmd:?}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().expect("run the layout program");
    assert!(run.status.success(), "the layout program failed: {run:?}");
    String::from_utf8(run.stdout).expect("UTF-8 output")
}

#[test]
fn rust_abi_matches_the_c_header() {
    let header = strip_comments(&std::fs::read_to_string(HEADER).expect("read the C header"));
    let structs = header_structs(&header);
    let constants = header_constants(&header);
    assert!(structs.len() >= 18, "parsed too few structs: {structs:?}");

    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"toast_backend.h\"\nint main(void) {\n",
    );
    for (s, fields) in &structs {
        c.push_str(&format!(
            "  printf(\"struct {s} %zu %zu\\n\", sizeof({s}), _Alignof({s}));\n"
        ));
        for f in fields {
            c.push_str(&format!(
                "  printf(\"field {s} {f} %zu\\n\", offsetof({s}, {f}));\n"
            ));
        }
    }
    for (name, is_string) in &constants {
        if *is_string {
            c.push_str(&format!("  printf(\"const {name} %s\\n\", {name});\n"));
        } else {
            c.push_str(&format!(
                "  printf(\"const {name} %llu\\n\", (unsigned long long)({name}));\n"
            ));
        }
    }
    for t in rust_typedef_sizes().keys() {
        c.push_str(&format!("  printf(\"typedef {t} %zu\\n\", sizeof({t}));\n"));
    }
    // The function-like macro, at the minors of `rust_constants`.
    for m in DEVICE_INFO_SIZE_MINORS {
        c.push_str(&format!(
            "  printf(\"const TOAST_DEVICE_INFO_SIZE({m}) %zu\\n\", TOAST_DEVICE_INFO_SIZE({m}u));\n"
        ));
    }
    c.push_str("  return 0;\n}\n");
    let output = compile_and_run(&c);

    let mut c_layouts: BTreeMap<String, Layout> = BTreeMap::new();
    let mut c_consts: BTreeMap<String, String> = BTreeMap::new();
    let mut c_typedefs: BTreeMap<String, usize> = BTreeMap::new();
    for line in output.lines() {
        let w: Vec<&str> = line.splitn(4, ' ').collect();
        match w[..] {
            ["struct", s, size, align] => {
                let l = c_layouts.entry(s.to_string()).or_default();
                l.size = size.parse().unwrap();
                l.align = align.parse().unwrap();
            }
            ["field", s, f, off] => {
                c_layouts
                    .entry(s.to_string())
                    .or_default()
                    .fields
                    .insert(f.to_string(), off.parse().unwrap());
            }
            ["const", name, value] => {
                c_consts.insert(name.to_string(), value.to_string());
            }
            ["typedef", t, size] => {
                c_typedefs.insert(t.to_string(), size.parse().unwrap());
            }
            _ => panic!("unexpected line from the layout program: {line:?}"),
        }
    }

    let rust = rust_side();
    let mut problems = Vec::new();
    for name in c_layouts.keys().filter(|k| !rust.contains_key(*k)) {
        problems.push(format!(
            "struct {name} is in the header but not checked against abi.rs"
        ));
    }
    for name in rust.keys().filter(|k| !c_layouts.contains_key(*k)) {
        problems.push(format!("struct {name} is checked but not in the header"));
    }
    for (name, c) in &c_layouts {
        let Some(r) = rust.get(name) else { continue };
        if (c.size, c.align) != (r.size, r.align) {
            problems.push(format!(
                "{name}: C size {} align {}, Rust size {} align {}",
                c.size, c.align, r.size, r.align
            ));
        }
        for (f, off) in &c.fields {
            match r.fields.get(f) {
                None => problems.push(format!("{name}.{f} (C offset {off}) has no Rust field")),
                Some(ro) if ro != off => {
                    problems.push(format!("{name}.{f}: C offset {off}, Rust offset {ro}"))
                }
                Some(_) => {}
            }
        }
        for f in r.fields.keys().filter(|f| !c.fields.contains_key(*f)) {
            problems.push(format!("{name}.{f} is a Rust field with no C field"));
        }
    }
    let rc = rust_constants();
    for (name, v) in &c_consts {
        match rc.get(name) {
            None => problems.push(format!("constant {name} = {v} has no Rust counterpart")),
            Some(r) if r != v => problems.push(format!("constant {name}: C {v}, Rust {r}")),
            Some(_) => {}
        }
    }
    for name in rc.keys().filter(|k| !c_consts.contains_key(*k)) {
        problems.push(format!("constant {name} is not in the header"));
    }
    for (t, size) in rust_typedef_sizes() {
        if c_typedefs.get(&t) != Some(&size) {
            problems.push(format!(
                "typedef {t}: C size {:?}, Rust size {size}",
                c_typedefs.get(&t)
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "the Rust ABI mirror differs from the C header:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn header_parser_sees_every_kind_of_field() {
    let src = strip_comments(
        "/* x */ typedef struct a { uint64_t n; // y\n const int32_t *p; char name[128];\n \
         toast_status (*f)(void *ctx,\n uint64_t h); } a;\n#define TOAST_X 3u\n#define TOAST_H\n",
    );
    assert_eq!(
        header_structs(&src),
        vec![(
            "a".to_string(),
            vec!["n".into(), "p".into(), "name".into(), "f".into()]
        )]
    );
    assert_eq!(header_constants(&src), vec![("TOAST_X".to_string(), false)]);
}

/// The header's function table holds the kernel table's slots, in its
/// order after the lifecycle and memory entries, each taking the argument
/// struct the kernel table names (so a kernel added to the table and not to
/// the header, or the other way round, fails here).
#[test]
fn the_header_table_follows_the_kernel_table() {
    let header = strip_comments(&std::fs::read_to_string(HEADER).expect("read the C header"));
    let start = header
        .find("typedef struct toast_backend_table {")
        .expect("the table struct");
    let body = &header[start..start + header[start..].find('}').unwrap()];
    let decls: Vec<String> = body
        .split(';')
        .map(|d| d.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|d| d.contains("(*"))
        .collect();
    let kernels = &decls[decls.len() - Kernel::ALL.len()..];
    for (k, d) in Kernel::ALL.iter().zip(kernels) {
        assert!(
            d.contains(&format!("(*{})(", k.slot()))
                && d.contains(&format!("const {} *", k.c_args())),
            "kernel {k}: the header declares `{d}`, the kernel table says slot `{}` taking `const {} *`",
            k.slot(),
            k.c_args()
        );
    }
    assert_eq!(decls.len(), 11 + Kernel::ALL.len(), "{decls:?}");
}
