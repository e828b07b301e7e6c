/* kernels.h -- every kernel of the kernel table (toast_kernels!: TOAST's
 * and our own, such as the PCG solver's vector kernels) for every device
 * target (CUDA, HIP, OpenCL), written once in a C subset that NVRTC, hiprtc
 * and OpenCL C 1.2 / 3.0 all accept (the kernels after the per-sample ones,
 * cov_accum_diag_hits/invnpp, filter_polynomial, filter_poly2D,
 * cov_apply_diag, amp_dot, amp_axpby, have their own launch shapes; the
 * map-maker's fused kernels are at the end, with their own notes).  It is
 * compiled after one of prelude_{cuda,hip,opencl}.h, which defines
 * KERNEL, GLOBAL, RESTRICT, DEVICE_FN, the integer types i64/u64/i32/u8,
 * I64_MIN, the grid indices GID0..GID2, atomic_add_f64, atomic_add_i64,
 * atomic_min_u64, and for kernels whose threads cooperate within a block
 * (one block per fit: the polynomial filters; one per amplitude:
 * template_offset_project_signal) LID0, LSIZE0, GRP0..GRP2,
 * BLOCK_SHARED(type, name, n) (an array shared by the block, declared at a
 * kernel's top level), SHARED (the qualifier of a pointer to one) and
 * BLOCK_BARRIER() (every thread of the block must reach it).
 *
 * Launch shape (TOAST's offload layout).  Per-sample kernels run on a 3-D
 * grid: dimension 0 is the sample offset inside an interval (0 up to the
 * longest interval, rounded up to the work-group size), dimension 1 the
 * interval (iv0 + GID1, below iv_end), dimension 2 the detector
 * (det0 + GID2, below det_end).  A thread past its interval's end returns at
 * once.  det0/iv0 let the host split a call into several launches (grid
 * limits, or detectors / intervals that must run one after the other because
 * they write the same element).  Intervals are a device array of
 * (first, last) i64 pairs; per-detector index arrays and constants are small
 * device arrays.
 *
 * Arithmetic follows the CPU reference (backend-cpu, TOAST 3.0.6's C++)
 * operation for operation with FP contraction disabled.  Where a result is
 * an integer decided by the last bit of a double (the HEALPix pixel), every
 * operation on the way must round as glibc does on the CPU: + - * / sqrt,
 * fabs, floor and the conversions are exact or correctly rounded on every
 * target, but a device's atan2 is not (see toast_atan2), so pixels_healpix
 * uses toast_atan2, a correctly rounded atan2 written here.  No other
 * kernel turns a rounded value into a branch or an index: pointing_detector,
 * scan_map, noise_weight and the template kernels use only + - * on doubles
 * and integer arithmetic (exact, contraction off).  stokes_weights_IQU
 * feeds only floating-point outputs, but its formula amplifies an ulp of
 * the trigonometry at special directions (poles, rotations by pi, HWP
 * angles on a quadrant seam), so it too uses functions written here,
 * toast_atan2, toast_sin and toast_cos: correctly rounded, the same bits on
 * every target, glibc's except where glibc itself is off by more than half
 * an ulp (its NaN for a rotated z below -1 comes from sqrt, exact
 * everywhere).  build_noise_weighted
 * accumulates with atomics, so its summation order (and the last bits of
 * zmap) is not deterministic; every other kernel writes each output element
 * from one thread (template_offset_project_signal: one block per amplitude,
 * its threads' partial sums added in a fixed tree, thread 0 writing).
 *
 * Data-dependent errors (a pixel beyond the map or in a non-local submap, a
 * quaternion with no valid pixel) are never written out of bounds: the
 * thread records  (det << 44) | sample  into err[0] with atomic_min_u64 and
 * returns; the host, which initialised err[0] to all ones, turns the
 * smallest key into a message naming the detector and the sample.
 */

#define TOAST_ERR_KEY(det, s) ((((u64)(det)) << 44) | (u64)(s))

/* Common prologue of the per-sample kernels: defines det, iv, first, s. */
#define TOAST_SAMPLE_GRID(intervals)                 \
    const i64 det = det0 + GID2;                     \
    const i64 iv = iv0 + GID1;                       \
    if (det >= det_end || iv >= iv_end) {            \
        return;                                      \
    }                                                \
    const i64 first = (intervals)[2 * iv];           \
    const i64 s = first + GID0;                      \
    if (s >= (intervals)[2 * iv + 1]) {              \
        return;                                      \
    }

#define TOAST_GRID_ARGS i64 det0, i64 det_end, i64 iv0, i64 iv_end

/* ---- quaternions and HEALPix ------------------------------------------ */

/* hpix_qa_rotate(q, v), every term kept so signed zeros / NaNs propagate. */
DEVICE_FN void toast_qa_rotate(const double *q, const double *v, double *out) {
    double xw = q[3] * q[0];
    double yw = q[3] * q[1];
    double zw = q[3] * q[2];
    double x2 = -q[0] * q[0];
    double xy = q[0] * q[1];
    double xz = q[0] * q[2];
    double y2 = -q[1] * q[1];
    double yz = q[1] * q[2];
    double z2 = -q[2] * q[2];
    out[0] = 2.0 * ((y2 + z2) * v[0] + (xy - zw) * v[1] + (yw + xz) * v[2]) + v[0];
    out[1] = 2.0 * ((zw + xy) * v[0] + (x2 + z2) * v[1] + (yz - xw) * v[2]) + v[1];
    out[2] = 2.0 * ((xz - yw) * v[0] + (xw + yz) * v[1] + (x2 + y2) * v[2]) + v[2];
}

/* (int64_t)x as x86-64 computes it: truncation, I64_MIN for NaN or out of
 * range (C leaves that undefined; the CPU reference reproduces cvttsd2si). */
DEVICE_FN i64 toast_c_i64(double x) {
    if (x >= -9223372036854775808.0 && x < 9223372036854775808.0) {
        return (i64)x;
    }
    return I64_MIN;
}

/* Wrapping 64-bit arithmetic (signed overflow is undefined in C). */
DEVICE_FN i64 toast_wadd(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
DEVICE_FN i64 toast_wsub(i64 a, i64 b) { return (i64)((u64)a - (u64)b); }
DEVICE_FN i64 toast_wmul(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }
DEVICE_FN i64 toast_wshl(i64 a, i64 n) { return (i64)((u64)a << (n & 63)); }
DEVICE_FN i64 toast_wdiv(i64 a, i64 b) {
    if (b == -1) {
        return toast_wsub(0, a);
    }
    return a / b;
}
DEVICE_FN i64 toast_wrem(i64 a, i64 b) {
    if (b == -1) {
        return 0;
    }
    return a % b;
}

/* The bit-spreading table of hpix_init_utab, computed. */
DEVICE_FN i64 toast_utab(i64 m) {
    return (m & 0x1) | ((m & 0x2) << 1) | ((m & 0x4) << 2) | ((m & 0x8) << 3) |
           ((m & 0x10) << 4) | ((m & 0x20) << 5) | ((m & 0x40) << 6) | ((m & 0x80) << 7);
}

DEVICE_FN i64 toast_ut(i64 x, i64 shift) { return toast_utab((x >> shift) & 0xff); }

DEVICE_FN i64 toast_xy2pix(i64 x, i64 y) {
    return toast_ut(x, 0) | toast_wshl(toast_ut(x, 8), 16) | toast_wshl(toast_ut(x, 16), 32) |
           toast_wshl(toast_ut(x, 24), 48) | toast_wshl(toast_ut(y, 0), 1) |
           toast_wshl(toast_ut(y, 8), 17) | toast_wshl(toast_ut(y, 16), 33) |
           toast_wshl(toast_ut(y, 24), 49);
}

/* ---- a correctly rounded atan2 ------------------------------------------ */

/* pixels_healpix needs atan2 to the last bit: at a pixel boundary (z = 2/3
 * at phi = 3pi/4, or any phi on a quadrant seam or halfway between) the
 * pixel changes with one ulp of phi.  TOAST calls glibc's atan2, which is
 * correctly rounded; a device's atan2 is only faithful (PoCL 3.1 returns
 * 2.3561944901923448 for atan2(0.52704627669473014, -0.52704627669472981),
 * 0.505 ulp from the true value, where glibc returns 2.3561944901923444,
 * 0.495 ulp; CUDA and HIP document up to 2 ulps).  toast_atan2 evaluates
 * atan2 in double-double (relative error about 2^-80) and rounds once, so it
 * gives glibc's result except for inputs whose atan2 lies within about
 * 2^-27 ulp of a rounding midpoint.  It needs a correctly rounded fma,
 * division and sqrt, which every target has (cl_khr_fp64, CUDA, HIP, the
 * host).  Zeros, infinities and NaNs go to the target's atan2, whose special
 * values (+-0, +-pi/2, +-pi, +-pi/4, +-3pi/4, NaN) are exact constants. */

/* s + e = a + b exactly. */
DEVICE_FN void toast_two_sum(double a, double b, double *s, double *e) {
    double x = a + b;
    double bb = x - a;
    *e = (a - (x - bb)) + (b - bb);
    *s = x;
}

/* s + e = a + b exactly, for |a| >= |b| (or a = 0). */
DEVICE_FN void toast_fast_two_sum(double a, double b, double *s, double *e) {
    double x = a + b;
    *e = b - (x - a);
    *s = x;
}

/* (h, l) = (ah, al) + (bh, bl), double-double, normalised. */
DEVICE_FN void toast_dd_add(double ah, double al, double bh, double bl, double *h, double *l) {
    double s, e, t, f;
    toast_two_sum(ah, bh, &s, &e);
    toast_two_sum(al, bl, &t, &f);
    e += t;
    toast_fast_two_sum(s, e, &s, &e);
    e += f;
    toast_fast_two_sum(s, e, h, l);
}

/* For u = (h, l) with |u| < 1: s + sl = u^2, t3 + t3l = u^3 and
 * q3 + q3l = u^3 / k, each in double-double (the leading terms of the
 * series of atan, sin and cos). */
DEVICE_FN void toast_dd_cube_over(double h, double l, double k, double *s, double *sl,
                                  double *t3, double *q3, double *q3l) {
    *s = h * h;
    *sl = fma(h, h, -*s) + 2.0 * h * l;
    *t3 = *s * h;
    const double t3l = fma(*s, h, -*t3) + (*sl * h + *s * l);
    *q3 = *t3 / k;
    *q3l = (fma(-*q3, k, *t3) + t3l) / k;
}

/* atan(k / 32) as a double-double, k = 0..32. */
DEVICE_FN void toast_atan_k32(int k, double *hi, double *lo) {
    switch (k) {
    case 0: *hi = 0.0; *lo = 0.0; break;
    case 1: *hi = 0.031239833430268277; *lo = -1.188442711587748e-18; break;
    case 2: *hi = 0.06241880999595735; *lo = -1.5490756308295046e-18; break;
    case 3: *hi = 0.09347678115858947; *lo = -6.2844725995420954e-18; break;
    case 4: *hi = 0.12435499454676144; *lo = -3.1253241424539383e-18; break;
    case 5: *hi = 0.15499674192394097; *lo = 9.585415594114324e-18; break;
    case 6: *hi = 0.18534794999569476; *lo = 4.180692268843079e-18; break;
    case 7: *hi = 0.21535769969773805; *lo = 4.738160130078733e-19; break;
    case 8: *hi = 0.24497866312686414; *lo = 1.0698755618734451e-17; break;
    case 9: *hi = 0.2741674511196588; *lo = 8.261353575163773e-18; break;
    case 10: *hi = 0.3028848683749714; *lo = -1.1010827903001369e-17; break;
    case 11: *hi = 0.3310960767041321; *lo = -7.952610375793799e-18; break;
    case 12: *hi = 0.35877067027057225; *lo = -2.4623815582638635e-17; break;
    case 13: *hi = 0.38588266939807375; *lo = 2.378822732491941e-17; break;
    case 14: *hi = 0.4124104415973873; *lo = -1.587652227770689e-17; break;
    case 15: *hi = 0.43833655985795783; *lo = -2.494277030626541e-17; break;
    case 16: *hi = 0.4636476090008061; *lo = 2.2698777452961687e-17; break;
    case 17: *hi = 0.48833395105640554; *lo = -1.1373236189329585e-17; break;
    case 18: *hi = 0.5123894603107377; *lo = -2.5462781472855804e-17; break;
    case 19: *hi = 0.5358112379604637; *lo = -4.0637956834825575e-18; break;
    case 20: *hi = 0.5585993153435624; *lo = -5.4556305485916264e-18; break;
    case 21: *hi = 0.5807563535676704; *lo = -1.441464378193067e-17; break;
    case 22: *hi = 0.6022873461349642; *lo = 2.950430737228402e-17; break;
    case 23: *hi = 0.6231993299340659; *lo = 2.672403885140095e-17; break;
    case 24: *hi = 0.6435011087932844; *lo = 1.5834785051444286e-17; break;
    case 25: *hi = 0.6632029927060933; *lo = -3.076054864429649e-17; break;
    case 26: *hi = 0.6823165548747481; *lo = 6.943223671560008e-18; break;
    case 27: *hi = 0.7008544078844502; *lo = -1.987626234335816e-17; break;
    case 28: *hi = 0.7188299996216245; *lo = -2.1478388444456983e-17; break;
    case 29: *hi = 0.7362574289814281; *lo = 3.473937648299457e-17; break;
    case 30: *hi = 0.7531512809621944; *lo = -2.4256934659182068e-17; break;
    case 31: *hi = 0.7695264804056583; *lo = -3.704991905602721e-17; break;
    case 32: *hi = 0.7853981633974483; *lo = 3.061616997868383e-17; break;
    default: *hi = 0.0; *lo = 0.0; break;
    }
}

DEVICE_FN double toast_atan2(double y, double x) {
    double ax = fabs(x);
    double ay = fabs(y);
    if (!(ax > 0.0 && ay > 0.0 && isfinite(ax) && isfinite(ay))) {
        return atan2(y, x);
    }
    /* r = num / den in [0, 1]; atan2 = octant transform of atan(r). */
    const int swap = ay > ax;
    double num = swap ? ax : ay;
    double den = swap ? ay : ax;
    if (den < 1e-250) {
        /* keep the remainder below exact (no subnormal products) */
        num = ldexp(num, 600);
        den = ldexp(den, 600);
    }
    const double rh = num / den;
    const double rl = rh < 1e-250 ? 0.0 : fma(-rh, den, num) / den;
    /* atan(r) = atan(c) + atan(u), c = k/32 nearest r, u = (r - c) / (1 + r c) */
    const int k = (int)(rh * 32.0 + 0.5);
    const double c = (double)k * 0.03125;
    double ch, cl;
    toast_atan_k32(k, &ch, &cl);
    double nh, nl;
    toast_two_sum(rh - c, rl, &nh, &nl); /* rh - c is exact (Sterbenz) */
    const double ph = rh * c;
    const double pl = fma(rh, c, -ph) + rl * c;
    double dh, dl;
    toast_dd_add(1.0, 0.0, ph, pl, &dh, &dl);
    const double uh0 = nh / dh;
    const double ul0 = ((fma(-uh0, dh, nh) + nl) - uh0 * dl) / dh;
    double uh, ul;
    toast_fast_two_sum(uh0, ul0, &uh, &ul);
    /* atan(u) = u - u^3/3 + u^5 (1/5 - u^2/7 + ...), |u| <= 1/64: the u^3
     * term in double-double, the rest (below 2^-30 u) in double. */
    double s, sl, t3, q3, q3l;
    toast_dd_cube_over(uh, ul, 3.0, &s, &sl, &t3, &q3, &q3l);
    const double poly =
        0.2 + s * (-1.0 / 7.0 + s * (1.0 / 9.0 + s * (-1.0 / 11.0 + s * (1.0 / 13.0 + s * (-1.0 / 15.0 + s / 17.0)))));
    const double t5 = t3 * s * poly;
    double ah, al;
    toast_dd_add(uh, ul, -q3, -q3l, &ah, &al);
    toast_dd_add(ah, al, t5, 0.0, &ah, &al);
    toast_dd_add(ch, cl, ah, al, &ah, &al);
    if (swap) {
        toast_dd_add(1.5707963267948966, 6.123233995736766e-17, -ah, -al, &ah, &al);
    }
    if (x < 0.0) {
        toast_dd_add(3.141592653589793, 1.2246467991473532e-16, -ah, -al, &ah, &al);
    }
    const double r = ah + al;
    return y < 0.0 ? -r : r;
}

/* ---- correctly rounded sin and cos ------------------------------------- */

/* stokes_weights_IQU turns the pointing into angles (atan2) and the angles
 * into weights (sin, cos); a device's sin and cos are a few ulps from
 * glibc's, and at special directions (poles, rotations by pi, HWP angles on
 * a quadrant seam) the formula amplifies one ulp into a hundred (2.1e-14 on
 * an H100, beyond the conformance tolerance).  toast_sin and toast_cos, like
 * toast_atan2, evaluate in double-double and round once, so every target
 * returns the same bits: the correctly rounded value, which is glibc's
 * except where glibc errs above half an ulp (measured on glibc 2.36: 0.14%
 * of random arguments in [-7, 7], by at most 0.51 ulp).
 *
 * Steps: x = k pi/2 + r with pi/2 in three doubles (k pi/2 subtracted in
 * double-double, products exact by fma), then r = j/32 + d with |d| <= 1/64
 * and sin, cos of j/32 from a table of double-doubles, then the series of d
 * (the leading terms in double-double, the tail, below 2^-28 of the result,
 * in double), then sin(c + d) and cos(c + d) by the addition formulas.
 * |x| below 2^-26 gives x (sin), below 2^-27 1 (cos): the correctly rounded
 * results;
 * |x| of 2^30 and more, infinities and NaNs go to the target's sin and cos
 * (no angle of a pointing is that large). */

/* sin(j / 32) and cos(j / 32) as double-doubles, j = 0..26. */
DEVICE_FN void toast_sincos_j32(int j, double *sh, double *sl, double *ch, double *cl) {
    switch (j) {
    case 0: *sh = 0.0; *sl = 0.0; *ch = 1.0; *cl = 0.0; break;
    case 1: *sh = 0.03124491398532608; *sl = -1.562781562225433e-18; *ch = 0.9995117584851364; *cl = -3.418806487972947e-17; break;
    case 2: *sh = 0.0624593178423802; *sl = -2.040259504585711e-18; *ch = 0.9980475107000991; *cl = 3.3232291674141346e-17; break;
    case 3: *sh = 0.09361273123551289; *sl = 1.4628632005878733e-18; *ch = 0.9956086864580017; *cl = 3.312922430932991e-17; break;
    case 4: *sh = 0.12467473338522769; *sl = -2.925947496057858e-18; *ch = 0.992197667229329; *cl = 4.754870575189364e-17; break;
    case 5: *sh = 0.15561499277355603; *sl = 8.886053372342288e-18; *ch = 0.9878177838164719; *cl = 4.91917302237681e-17; break;
    case 6: *sh = 0.18640329676226988; *sl = 2.3493796901281573e-18; *ch = 0.9824733131012553; *cl = -3.919920375420088e-17; break;
    case 7: *sh = 0.21700958109501015; *sl = 1.1170071073364376e-17; *ch = 0.9761694738686353; *cl = -7.850690609285027e-18; break;
    case 8: *sh = 0.24740395925452294; *sl = -7.53102495590706e-18; *ch = 0.9689124217106447; *cl = 5.071436662403936e-17; break;
    case 9: *sh = 0.2775567516463363; *sl = 1.7674070262791822e-17; *ch = 0.9607092430155619; *cl = -2.807827063516729e-17; break;
    case 10: *sh = 0.30743851458038085; *sl = 1.1004366442765296e-19; *ch = 0.9515679480481722; *cl = -3.8614834675674123e-17; break;
    case 11: *sh = 0.33702006902225307; *sl = 1.0312279860787216e-17; *ch = 0.9414974631278811; *cl = -4.8523830236797095e-18; break;
    case 12: *sh = 0.36627252908604757; *sl = -9.938814562106524e-18; *ch = 0.9305076219123143; *cl = 4.488760003328074e-18; break;
    case 13: *sh = 0.39516733024093426; *sl = -1.9613487871414228e-17; *ch = 0.9186091557949183; *cl = -4.0564150104514996e-17; break;
    case 14: *sh = 0.42367625720393803; *sl = -2.331800700068871e-17; *ch = 0.9058136834259364; *cl = 4.2864666490805214e-17; break;
    case 15: *sh = 0.4517714714916838; *sl = -8.234073942098903e-18; *ch = 0.8921336993669944; *cl = 2.3160655211380166e-17; break;
    case 16: *sh = 0.479425538604203; *sl = -5.103969860556013e-18; *ch = 0.8775825618903728; *cl = -4.2623149864279997e-17; break;
    case 17: *sh = 0.5066114548142574; *sl = -3.269413423618168e-17; *ch = 0.8621744799348805; *cl = 4.4132427578105805e-18; break;
    case 18: *sh = 0.5333026735360201; *sl = 5.129318115032044e-17; *ch = 0.8459244992310679; *cl = 1.549506647350329e-17; break;
    case 19: *sh = 0.5594731312473669; *sl = 1.575565514488728e-17; *ch = 0.8288484876093257; *cl = 1.1163935406617444e-17; break;
    case 20: *sh = 0.5850972729404622; *sl = -5.4883972461161805e-17; *ch = 0.8109631195052179; *cl = -3.091333486122179e-17; break;
    case 21: *sh = 0.6101500770757914; *sl = -1.479826990758988e-17; *ch = 0.7922858596771786; *cl = -2.9049779312834576e-17; break;
    case 22: *sh = 0.6346070800152693; *sl = -3.4568582392624965e-17; *ch = 0.7728349461524715; *cl = 4.231014921891023e-17; break;
    case 23: *sh = 0.6584443999105676; *sl = -3.7736386700306717e-17; *ch = 0.7526293724180665; *cl = -1.2970993013150526e-17; break;
    case 24: *sh = 0.6816387600233341; *sl = 4.410467313197903e-17; *ch = 0.7316888688738209; *cl = -1.0475824306512768e-17; break;
    case 25: *sh = 0.7041675114545337; *sl = -3.94095700584825e-17; *ch = 0.7100338835660797; *cl = 1.505272211891291e-17; break;
    case 26: *sh = 0.7260086552607126; *sl = -1.573621815339587e-17; *ch = 0.6876855622205048; *cl = 3.5430696752823923e-17; break;
    default: *sh = 0.0; *sl = 0.0; *ch = 1.0; *cl = 0.0; break;
    }
}

/* (h, l) = (ah, al) * (bh, bl), double-double. */
DEVICE_FN void toast_dd_mul(double ah, double al, double bh, double bl, double *h, double *l) {
    const double p = ah * bh;
    const double e = fma(ah, bh, -p) + (ah * bl + al * bh);
    toast_fast_two_sum(p, e, h, l);
}

/* sin(x) and cos(x) as double-doubles, for 2^-26 <= |x| < 2^30 (finite). */
DEVICE_FN void toast_sincos_dd(double x, double *sh, double *sl, double *ch, double *cl) {
    /* x = k pi/2 + (rh + rl) */
    const double kd = rint(x * 0.6366197723675814);
    double rh = x, rl = 0.0;
    const double pio2_1 = 1.5707963267948966;
    const double pio2_2 = 6.123233995736766e-17;
    const double pio2_3 = -1.4973849048591698e-33;
    double ph = kd * pio2_1;
    toast_dd_add(rh, rl, -ph, -fma(kd, pio2_1, -ph), &rh, &rl);
    ph = kd * pio2_2;
    toast_dd_add(rh, rl, -ph, -fma(kd, pio2_2, -ph), &rh, &rl);
    toast_dd_add(rh, rl, -(kd * pio2_3), 0.0, &rh, &rl);
    /* r = c + d, c = j / 32 */
    const double jd = rint(rh * 32.0);
    double dh, dl;
    toast_fast_two_sum(rh - jd * 0.03125, rl, &dh, &dl); /* rh - c is exact */
    /* d^2, d^3 / 6 */
    double s2, s2l, t3, q3, q3l;
    toast_dd_cube_over(dh, dl, 6.0, &s2, &s2l, &t3, &q3, &q3l);
    /* sin d = d - d^3/6 + d^5 (1/120 - d^2/5040 + d^4/362880) */
    const double t5 = t3 * s2 * (1.0 / 120.0 + s2 * (-1.0 / 5040.0 + s2 * (1.0 / 362880.0)));
    double sdh, sdl;
    toast_dd_add(dh, dl, -q3, -q3l, &sdh, &sdl);
    toast_dd_add(sdh, sdl, t5, 0.0, &sdh, &sdl);
    /* cos d = 1 - d^2/2 + d^4 (1/24 - d^2/720 + d^4/40320) */
    const double t4 = s2 * s2 * (1.0 / 24.0 + s2 * (-1.0 / 720.0 + s2 * (1.0 / 40320.0)));
    double cdh, cdl;
    toast_dd_add(1.0, 0.0, -0.5 * s2, -0.5 * s2l, &cdh, &cdl);
    toast_dd_add(cdh, cdl, t4, 0.0, &cdh, &cdl);
    /* sin c, cos c */
    const int j = (int)jd;
    double sch, scl, cch, ccl;
    toast_sincos_j32(j < 0 ? -j : j, &sch, &scl, &cch, &ccl);
    if (j < 0) {
        sch = -sch;
        scl = -scl;
    }
    /* sin r = sin c cos d + cos c sin d; cos r = cos c cos d - sin c sin d */
    double ah, al, bh, bl, srh, srl, crh, crl;
    toast_dd_mul(sch, scl, cdh, cdl, &ah, &al);
    toast_dd_mul(cch, ccl, sdh, sdl, &bh, &bl);
    toast_dd_add(ah, al, bh, bl, &srh, &srl);
    toast_dd_mul(cch, ccl, cdh, cdl, &ah, &al);
    toast_dd_mul(sch, scl, sdh, sdl, &bh, &bl);
    toast_dd_add(ah, al, -bh, -bl, &crh, &crl);
    /* the quadrant */
    switch ((int)((i64)kd & 3)) {
    case 0: *sh = srh; *sl = srl; *ch = crh; *cl = crl; break;
    case 1: *sh = crh; *sl = crl; *ch = -srh; *cl = -srl; break;
    case 2: *sh = -srh; *sl = -srl; *ch = -crh; *cl = -crl; break;
    default: *sh = -crh; *sl = -crl; *ch = srh; *cl = srl; break;
    }
}

DEVICE_FN double toast_sin(double x) {
    const double ax = fabs(x);
    if (!(ax < 1073741824.0)) {
        return sin(x);
    }
    if (ax < 1.4901161193847656e-08) {
        return x;
    }
    double sh, sl, ch, cl;
    toast_sincos_dd(x, &sh, &sl, &ch, &cl);
    return sh + sl;
}

DEVICE_FN double toast_cos(double x) {
    const double ax = fabs(x);
    if (!(ax < 1073741824.0)) {
        return cos(x);
    }
    if (ax < 7.450580596923828e-09) {
        return 1.0;
    }
    double sh, sl, ch, cl;
    toast_sincos_dd(x, &sh, &sl, &ch, &cl);
    return ch + cl;
}

/* tt from phi, as both zphi2* functions compute it. */
DEVICE_FN double toast_hpix_tt(double phi) {
    const double tol = 10.0 * 2.220446049250313080847263336181640625e-16;
    const double m = 6.283185307179586476925286766559;   /* 2 pi */
    const double two_over_pi = 0.63661977236758134308;
    double div = phi / m;
    double phi_mod = m * (div - (double)toast_c_i64(div));
    if (phi_mod < tol && phi_mod > -tol) {
        phi_mod = 0.0;
    }
    if (phi_mod >= 0.0) {
        return phi_mod * two_over_pi;
    }
    return phi_mod * two_over_pi + 4.0;
}

/* The pixel of quaternion q's direction; returns 0 when the direction is
 * not finite or the pixel is outside [0, 12 nside^2), else 1. */
DEVICE_FN int toast_hpix_pixel(const double *q, i64 nside, i64 factor, int nest, i64 *pix) {
    const double zaxis[3] = {0.0, 0.0, 1.0};
    double dir[3];
    toast_qa_rotate(q, zaxis, dir);
    if (!(isfinite(dir[0]) && isfinite(dir[1]) && isfinite(dir[2]))) {
        return 0;
    }
    const double dnside = (double)nside;
    const double halfnside = 0.5 * dnside;
    const double tqnside = 0.75 * dnside;
    const i64 nsm1 = nside - 1;
    const i64 ncap = 2 * (nside * nside - nside);
    const i64 npix = 12 * nside * nside;
    const i64 fournside = 4 * nside;
    /* hpix_vec2zphi */
    const double z = dir[2];
    const double za = fabs(z);
    const int itemp = z > 0.0 ? 1 : -1;
    const int region = za <= 0.66666666666666666667 ? itemp : itemp + itemp;
    const double rtz = sqrt(3.0 * (1.0 - za));
    const double phi = toast_atan2(dir[1], dir[0]);
    const double tt = toast_hpix_tt(phi);
    i64 p;
    if (nest) {
        i64 face, x, y;
        if (region == 1 || region == -1) {
            double temp1 = halfnside + dnside * tt;
            double temp2 = tqnside * z;
            i64 jp = toast_c_i64(temp1 - temp2);
            i64 jm = toast_c_i64(temp1 + temp2);
            i64 ifp = jp >> factor;
            i64 ifm = jm >> factor;
            if (ifp == ifm) {
                face = ifp == 4 ? 4 : toast_wadd(ifp, 4);
            } else if (ifp < ifm) {
                face = ifp;
            } else {
                face = toast_wadd(ifm, 8);
            }
            x = jm & nsm1;
            y = toast_wsub(nsm1, jp & nsm1);
        } else {
            i64 ntt = toast_c_i64(tt);
            double tp = tt - (double)ntt;
            double temp1 = dnside * rtz;
            i64 jp = toast_c_i64(tp * temp1);
            i64 jm = toast_c_i64((1.0 - tp) * temp1);
            if (jp >= nside) {
                jp = nsm1;
            }
            if (jm >= nside) {
                jm = nsm1;
            }
            if (z >= 0.0) {
                face = ntt;
                x = toast_wsub(nsm1, jm);
                y = toast_wsub(nsm1, jp);
            } else {
                face = toast_wadd(ntt, 8);
                x = jp;
                y = jm;
            }
        }
        p = toast_wadd(toast_xy2pix(x, y), toast_wshl(face, 2 * factor));
    } else {
        if (region == 1 || region == -1) {
            double temp1 = halfnside + dnside * tt;
            double temp2 = tqnside * z;
            i64 jp = toast_c_i64(temp1 - temp2);
            i64 jm = toast_c_i64(temp1 + temp2);
            i64 ir = toast_wsub(toast_wadd(nside + 1, jp), jm);
            i64 kshift = 1 - (ir & 1);
            i64 ip = toast_wadd(toast_wsub(toast_wadd(jp, jm), nside), kshift + 1) >> 1;
            ip = toast_wrem(ip, fournside);
            p = toast_wadd(ncap, toast_wadd(toast_wmul(toast_wsub(ir, 1), fournside), ip));
        } else {
            double tp = tt - floor(tt);
            double temp1 = dnside * rtz;
            i64 jp = toast_c_i64(tp * temp1);
            i64 jm = toast_c_i64((1.0 - tp) * temp1);
            i64 ir = toast_wadd(toast_wadd(jp, jm), 1);
            i64 ip = toast_c_i64(tt * (double)ir);
            i64 d = toast_wmul(ir, 4);
            if (d == 0) {
                return 0;
            }
            ip = toast_wsub(ip, toast_wdiv(ip, d));
            if (region > 0) {
                p = toast_wadd(toast_wmul(toast_wmul(ir, 2), toast_wsub(ir, 1)), ip);
            } else {
                p = toast_wadd(toast_wsub(npix, toast_wmul(toast_wmul(ir, 2), toast_wadd(ir, 1))),
                               ip);
            }
        }
    }
    if (p < 0 || p >= npix) {
        return 0;
    }
    *pix = p;
    return 1;
}

/* Local submap and sub-pixel of pixel pix >= 0; 0 when the pixel is beyond
 * the map or in a submap that is not local (global2local = -1). The host has
 * checked every global2local entry lies in [-1, n_local_submap). */
DEVICE_FN int toast_locate(GLOBAL const i64 *g2l, i64 n_global_submap, i64 n_pix_submap, i64 pix,
                           i64 *out_local, i64 *out_sub) {
    i64 g = pix / n_pix_submap;
    if (g >= n_global_submap) {
        return 0;
    }
    i64 l = g2l[g];
    if (l < 0) {
        return 0;
    }
    *out_local = l;
    *out_sub = pix - g * n_pix_submap;
    return 1;
}

/* The local map pixel (l * n_pix_submap + sub) of sample s of detector det
 * in the map-domain accumulations (build_noise_weighted,
 * cov_accum_timestream): 0 when its flags cut it (det_flags row
 * flag_index[det] with det_mask, shared_flags with shared_mask, each when
 * used) or its pixel is negative; 0 with the sample's key recorded in err
 * when the pixel is not in a local submap; else 1. */
DEVICE_FN int toast_accum_pixel(i64 det, i64 s, i64 n_samp, GLOBAL const i32 *pixel_index,
                                GLOBAL const i32 *flag_index, GLOBAL const i64 *g2l,
                                i64 n_global_submap, i64 n_pix_submap, GLOBAL const i64 *pixels,
                                GLOBAL const u8 *det_flags, i32 use_det_flags, i32 det_mask,
                                GLOBAL const u8 *shared_flags, i32 use_shared_flags,
                                i32 shared_mask, GLOBAL u64 *err, i64 *out_px) {
    if (use_det_flags && (det_flags[(i64)flag_index[det] * n_samp + s] & det_mask) != 0) {
        return 0;
    }
    if (use_shared_flags && (shared_flags[s] & shared_mask) != 0) {
        return 0;
    }
    const i64 p = pixels[(i64)pixel_index[det] * n_samp + s];
    if (p < 0) {
        return 0;
    }
    i64 l = 0;
    i64 sub = 0;
    if (!toast_locate(g2l, n_global_submap, n_pix_submap, p, &l, &sub)) {
        atomic_min_u64(err, TOAST_ERR_KEY(det, s));
        return 0;
    }
    *out_px = l * n_pix_submap + sub;
    return 1;
}

/* ---- 1. pointing_detector ---------------------------------------------- */

KERNEL void toast_pointing_detector(TOAST_GRID_ARGS, i64 n_samp,
                                    GLOBAL const i64 *RESTRICT intervals,
                                    GLOBAL const i32 *RESTRICT quat_index,
                                    GLOBAL const double *RESTRICT focalplane,
                                    GLOBAL const double *RESTRICT boresight,
                                    GLOBAL const u8 *RESTRICT shared_flags, i32 use_flags,
                                    i32 mask, GLOBAL double *RESTRICT quats) {
    TOAST_SAMPLE_GRID(intervals)
    double p[4];
    if (use_flags && (shared_flags[s] & mask) != 0) {
        p[0] = 0.0;
        p[1] = 0.0;
        p[2] = 0.0;
        p[3] = 1.0;
    } else {
        p[0] = boresight[4 * s];
        p[1] = boresight[4 * s + 1];
        p[2] = boresight[4 * s + 2];
        p[3] = boresight[4 * s + 3];
    }
    const double q0 = focalplane[4 * det];
    const double q1 = focalplane[4 * det + 1];
    const double q2 = focalplane[4 * det + 2];
    const double q3 = focalplane[4 * det + 3];
    const i64 o = 4 * ((i64)quat_index[det] * n_samp + s);
    quats[o] = p[0] * q3 + p[1] * q2 - p[2] * q1 + p[3] * q0;
    quats[o + 1] = -p[0] * q2 + p[1] * q3 + p[2] * q0 + p[3] * q1;
    quats[o + 2] = p[0] * q1 - p[1] * q0 + p[2] * q3 + p[3] * q2;
    quats[o + 3] = -p[0] * q0 - p[1] * q1 - p[2] * q2 + p[3] * q3;
}

/* ---- 2. pixels_healpix (one kernel per pixel type) --------------------- */

/* toast_pixels_healpix_i64 writes TOAST's i64 pixels; toast_pixels_healpix_i32
 * the compact pointing's (ABI minor 8, pixels_i32 = 1), where the host has
 * checked that 12 nside^2 fits an i32: the same pixel, narrowed exactly. */
#define TOAST_PIXELS_HEALPIX(NAME, PIXT)                                                       \
    KERNEL void NAME(TOAST_GRID_ARGS, i64 n_samp, GLOBAL const i64 *RESTRICT intervals,       \
                     GLOBAL const i32 *RESTRICT quat_index,                                    \
                     GLOBAL const i32 *RESTRICT pixel_index,                                   \
                     GLOBAL const double *RESTRICT quats,                                      \
                     GLOBAL const u8 *RESTRICT shared_flags, i32 use_flags, i32 mask,          \
                     GLOBAL PIXT *RESTRICT pixels, GLOBAL u8 *RESTRICT hit_submaps, i64 nside, \
                     i64 factor, i64 n_pix_submap, i32 nest, GLOBAL u64 *RESTRICT err) {       \
        TOAST_SAMPLE_GRID(intervals)                                                           \
        const i64 po = (i64)pixel_index[det] * n_samp + s;                                     \
        if (use_flags && (shared_flags[s] & mask) != 0) {                                      \
            pixels[po] = (PIXT)-1;                                                             \
            return;                                                                            \
        }                                                                                      \
        const i64 qo = 4 * ((i64)quat_index[det] * n_samp + s);                                \
        double q[4];                                                                           \
        q[0] = quats[qo];                                                                      \
        q[1] = quats[qo + 1];                                                                  \
        q[2] = quats[qo + 2];                                                                  \
        q[3] = quats[qo + 3];                                                                  \
        i64 pix = 0;                                                                           \
        if (!toast_hpix_pixel(q, nside, factor, nest, &pix)) {                                 \
            atomic_min_u64(err, TOAST_ERR_KEY(det, s));                                        \
            return;                                                                            \
        }                                                                                      \
        pixels[po] = (PIXT)pix;                                                                \
        /* Benign race: every writer stores 1. */                                              \
        hit_submaps[pix / n_pix_submap] = 1;                                                   \
    }

TOAST_PIXELS_HEALPIX(toast_pixels_healpix_i64, i64)
TOAST_PIXELS_HEALPIX(toast_pixels_healpix_i32, i32)

/* ---- 3. stokes_weights_I ----------------------------------------------- */

KERNEL void toast_stokes_weights_i(TOAST_GRID_ARGS, i64 n_samp,
                                   GLOBAL const i64 *RESTRICT intervals,
                                   GLOBAL const i32 *RESTRICT weight_index,
                                   GLOBAL const double *RESTRICT cal,
                                   GLOBAL double *RESTRICT weights) {
    TOAST_SAMPLE_GRID(intervals)
    weights[(i64)weight_index[det] * n_samp + s] = cal[det];
}

/* ---- 4. stokes_weights_IQU --------------------------------------------- */

/* The polarisation angle alpha of stokes_weights_alpha, with the correctly
 * rounded atan2, sin and cos (toast_atan2, toast_sin, toast_cos). */
DEVICE_FN double toast_stokes_alpha(const double *q) {
    const double zaxis[3] = {0.0, 0.0, 1.0};
    const double xaxis[3] = {1.0, 0.0, 0.0};
    double vd[3];
    double vo[3];
    toast_qa_rotate(q, zaxis, vd);
    toast_qa_rotate(q, xaxis, vo);
    double ang_xy = toast_atan2(vd[1], vd[0]);
    double vm_x = vd[2] * toast_cos(ang_xy);
    double vm_y = vd[2] * toast_sin(ang_xy);
    double vm_z = -sqrt(1.0 - vd[2] * vd[2]);
    double alpha_y = vd[0] * (vm_y * vo[2] - vm_z * vo[1]) - vd[1] * (vm_x * vo[2] - vm_z * vo[0]) +
                     vd[2] * (vm_x * vo[1] - vm_y * vo[0]);
    double alpha_x = vm_x * vo[0] + vm_y * vo[1] + vm_z * vo[2];
    return toast_atan2(alpha_y, alpha_x);
}

KERNEL void toast_stokes_weights_iqu(TOAST_GRID_ARGS, i64 n_samp,
                                     GLOBAL const i64 *RESTRICT intervals,
                                     GLOBAL const i32 *RESTRICT quat_index,
                                     GLOBAL const i32 *RESTRICT weight_index,
                                     GLOBAL const double *RESTRICT epsilon,
                                     GLOBAL const double *RESTRICT gamma,
                                     GLOBAL const double *RESTRICT cal,
                                     GLOBAL const double *RESTRICT quats,
                                     GLOBAL const double *RESTRICT hwp, i32 use_hwp, i32 iau,
                                     GLOBAL double *RESTRICT weights) {
    TOAST_SAMPLE_GRID(intervals)
    const double u_sign = iau ? -1.0 : 1.0;
    const double eps = epsilon[det];
    const double eta = (1.0 - eps) / (1.0 + eps);
    const double c = cal[det];
    const i64 qo = 4 * ((i64)quat_index[det] * n_samp + s);
    double q[4];
    q[0] = quats[qo];
    q[1] = quats[qo + 1];
    q[2] = quats[qo + 2];
    q[3] = quats[qo + 3];
    const i64 wo = 3 * ((i64)weight_index[det] * n_samp + s);
    const double al = toast_stokes_alpha(q);
    if (use_hwp) {
        double ang = 2.0 * (2.0 * (gamma[det] - hwp[s]) - al);
        double cang = toast_cos(ang);
        double sang = toast_sin(ang);
        weights[wo] = c;
        weights[wo + 1] = cang * eta * c;
        weights[wo + 2] = -sang * eta * c * u_sign;
    } else {
        double ang = al * 2.0;
        double cang = toast_cos(ang);
        double sang = toast_sin(ang);
        weights[wo] = c;
        weights[wo + 1] = cang * eta * c;
        weights[wo + 2] = sang * eta * c * u_sign;
    }
}

/* ---- 5. scan_map (one kernel per map dtype) ---------------------------- */

/* mode: 0 add, 1 subtract, 2 scale. */
#define TOAST_SCAN_MAP(NAME, MAPT)                                                              \
    KERNEL void NAME(TOAST_GRID_ARGS, i64 n_samp, GLOBAL const i64 *RESTRICT intervals,        \
                     i64 nnz, GLOBAL const i32 *RESTRICT pixel_index,                           \
                     GLOBAL const i32 *RESTRICT weight_index,                                   \
                     GLOBAL const i32 *RESTRICT data_index, GLOBAL const i64 *RESTRICT g2l,     \
                     i64 n_global_submap, i64 n_pix_submap, GLOBAL const MAPT *RESTRICT mapdata, \
                     GLOBAL const i64 *RESTRICT pixels, GLOBAL const double *RESTRICT weights,  \
                     GLOBAL double *RESTRICT det_data, double data_scale, i32 should_zero,      \
                     i32 mode, GLOBAL u64 *RESTRICT err) {                                      \
        TOAST_SAMPLE_GRID(intervals)                                                            \
        const i64 d_o = (i64)data_index[det] * n_samp + s;                                     \
        if (should_zero) {                                                                      \
            det_data[d_o] = 0.0;                                                                \
        }                                                                                       \
        const i64 p = pixels[(i64)pixel_index[det] * n_samp + s];                               \
        if (p < 0) {                                                                            \
            return;                                                                             \
        }                                                                                       \
        i64 l = 0;                                                                              \
        i64 sub = 0;                                                                            \
        if (!toast_locate(g2l, n_global_submap, n_pix_submap, p, &l, &sub)) {                  \
            atomic_min_u64(err, TOAST_ERR_KEY(det, s));                                         \
            return;                                                                             \
        }                                                                                       \
        const i64 mo = nnz * (l * n_pix_submap + sub);                                          \
        const i64 wo = nnz * ((i64)weight_index[det] * n_samp + s);                             \
        double val = 0.0;                                                                       \
        for (i64 i = 0; i < nnz; i++) {                                                         \
            val += weights[wo + i] * (double)mapdata[mo + i];                                   \
        }                                                                                       \
        val *= data_scale;                                                                      \
        if (mode == 1) {                                                                        \
            det_data[d_o] -= val;                                                               \
        } else if (mode == 2) {                                                                 \
            det_data[d_o] *= val;                                                               \
        } else {                                                                                \
            det_data[d_o] += val;                                                               \
        }                                                                                       \
    }

TOAST_SCAN_MAP(toast_scan_map_f64, double)
TOAST_SCAN_MAP(toast_scan_map_f32, float)
TOAST_SCAN_MAP(toast_scan_map_i64, i64)
TOAST_SCAN_MAP(toast_scan_map_i32, i32)

/* ---- 6. build_noise_weighted (atomic accumulation) --------------------- */

KERNEL void toast_build_noise_weighted(
    TOAST_GRID_ARGS, i64 n_samp, GLOBAL const i64 *RESTRICT intervals, i64 nnz,
    GLOBAL const i32 *RESTRICT pixel_index, GLOBAL const i32 *RESTRICT weight_index,
    GLOBAL const i32 *RESTRICT data_index, GLOBAL const i32 *RESTRICT flag_index,
    GLOBAL const double *RESTRICT det_scale, GLOBAL const i64 *RESTRICT g2l, i64 n_global_submap,
    i64 n_pix_submap, GLOBAL const i64 *RESTRICT pixels, GLOBAL const double *RESTRICT weights,
    GLOBAL const double *RESTRICT det_data, GLOBAL const u8 *RESTRICT det_flags,
    i32 use_det_flags, i32 det_mask, GLOBAL const u8 *RESTRICT shared_flags,
    i32 use_shared_flags, i32 shared_mask, GLOBAL double *RESTRICT zmap,
    GLOBAL u64 *RESTRICT err) {
    TOAST_SAMPLE_GRID(intervals)
    i64 px = 0;
    if (!toast_accum_pixel(det, s, n_samp, pixel_index, flag_index, g2l, n_global_submap,
                           n_pix_submap, pixels, det_flags, use_det_flags, det_mask, shared_flags,
                           use_shared_flags, shared_mask, err, &px)) {
        return;
    }
    const i64 zo = nnz * px;
    const i64 wo = nnz * ((i64)weight_index[det] * n_samp + s);
    const double scaled = det_data[(i64)data_index[det] * n_samp + s] * det_scale[det];
    for (i64 i = 0; i < nnz; i++) {
        atomic_add_f64(&zmap[zo + i], scaled * weights[wo + i]);
    }
}

/* ---- 7. noise_weight --------------------------------------------------- */

KERNEL void toast_noise_weight(TOAST_GRID_ARGS, i64 n_samp, GLOBAL const i64 *RESTRICT intervals,
                               GLOBAL const i32 *RESTRICT data_index,
                               GLOBAL const double *RESTRICT detector_weights,
                               GLOBAL double *RESTRICT det_data) {
    TOAST_SAMPLE_GRID(intervals)
    det_data[(i64)data_index[det] * n_samp + s] *= detector_weights[det];
}

/* ---- 8. template_offset_add_to_signal ---------------------------------- */

/* view_offset[v]: first amplitude of view v inside a detector's block. */
KERNEL void toast_template_offset_add_to_signal(
    TOAST_GRID_ARGS, i64 n_samp, GLOBAL const i64 *RESTRICT intervals,
    GLOBAL const i32 *RESTRICT data_index, i64 step_length, GLOBAL const i64 *RESTRICT amp_offset,
    GLOBAL const i64 *RESTRICT view_offset, GLOBAL const double *RESTRICT amplitudes,
    GLOBAL const u8 *RESTRICT amplitude_flags, GLOBAL double *RESTRICT det_data) {
    TOAST_SAMPLE_GRID(intervals)
    const i64 amp = amp_offset[det] + view_offset[iv] + (s - first) / step_length;
    if (amplitude_flags[amp] == 0) {
        det_data[(i64)data_index[det] * n_samp + s] += amplitudes[amp];
    }
}

/* ---- 9. template_offset_project_signal --------------------------------- */

/* Sum each of the `rows` rows of red (row r: red[r * LSIZE0 + t], one value
 * per thread t) over the block's threads into red[r * LSIZE0], by a tree of
 * fixed shape: with h the halves of the power of two at or above LSIZE0,
 * thread t < h adds element t + h (when it exists).  The result depends on
 * the block size only.  Every thread of the block must call it (it ends
 * with a barrier, after which element 0 of each row is visible to all). */
DEVICE_FN void toast_block_sum_rows(SHARED double *red, int rows) {
    const i64 t = LID0;
    const i64 nt = LSIZE0;
    i64 h = 1;
    while (h < nt) {
        h *= 2;
    }
    for (h /= 2; h > 0; h /= 2) {
        if (t < h && t + h < nt) {
            for (int r = 0; r < rows; r++) {
                red[r * nt + t] += red[r * nt + t + h];
            }
        }
        BLOCK_BARRIER();
    }
}

/* The samples [*s0, *s1) of amplitude k of detector det in interval iv, and
 * its index *amp: 0 (nothing to sum) where the detector or interval is
 * outside the launch, the detector has no amplitudes (a0 < 0), k is past
 * the interval's end, or the amplitude is flagged. */
DEVICE_FN int toast_amp_samples(i64 det, i64 det_end, i64 iv, i64 iv_end, i64 k,
                                GLOBAL const i64 *RESTRICT intervals, i64 step_length, i64 a0,
                                GLOBAL const i64 *RESTRICT view_offset,
                                GLOBAL const u8 *RESTRICT amplitude_flags, i64 *s0, i64 *s1,
                                i64 *amp) {
    if (det >= det_end || iv >= iv_end || a0 < 0) {
        return 0;
    }
    /* Amplitude k of the interval [first, last) starts at sample
     * first + k step_length, which is inside it only for k <= (len - 1) /
     * step_length; tested so, rather than by forming k step_length, which
     * a huge step length (n_amp_views may exceed what the interval needs)
     * would overflow. Then s0 <= last - 1, and s1 is formed without
     * s0 + step_length either. */
    const i64 first = intervals[2 * iv];
    const i64 last = intervals[2 * iv + 1];
    const i64 len = last - first;
    if (len <= 0 || k > (len - 1) / step_length) {
        return 0;
    }
    *s0 = first + k * step_length;
    *amp = a0 + view_offset[iv] + k;
    if (amplitude_flags[*amp] != 0) {
        return 0;
    }
    *s1 = last - *s0 > step_length ? *s0 + step_length : last;
    return 1;
}

/* One block (of TOAST_PROJECT_THREADS threads) per amplitude: block GRP0 is
 * the amplitude inside the view (up to the largest n_amp of a view), GRP1
 * the interval, GRP2 the detector.  Thread t sums the amplitude's samples
 * s0 + t, s0 + t + LSIZE0, ... in that order; the threads' sums are added in
 * block-shared memory by a tree of fixed shape (halves of the power of two
 * at or above LSIZE0, as toast_block_sum_rows), and thread 0 adds the total
 * to the existing value.  Deterministic for a block size, and every thread
 * reads consecutive samples with its neighbours (one amplitude may be a
 * whole observation); not the CPU's sample order: the amplitudes differ
 * from TOAST's by rounding (FORMAT.md section 9: rtol ~ 1e-15 x
 * step_length, the conformance runner's tolerant mode).  Every thread of a
 * block reaches the barriers: a block with nothing to do adds zeros and
 * writes nothing. */
#define TOAST_PROJECT_THREADS 128
/* The prologue of a kernel of one block per amplitude (grid dimension 0 the
 * amplitude in the view, 1 the interval, 2 the detector), over the kernel's
 * parameters intervals, step_length, amp_offset, view_offset and
 * amplitude_flags: the block-shared sums red, the detector det, interval
 * iv, thread t of nt, and the amplitude's samples [s0, s1) and index amp
 * where active (toast_amp_samples). */
#define TOAST_AMP_BLOCK                                                                    \
    BLOCK_SHARED(double, red, TOAST_PROJECT_THREADS);                                      \
    const i64 det = det0 + GRP2;                                                           \
    const i64 iv = iv0 + GRP1;                                                             \
    const i64 t = LID0;                                                                    \
    const i64 nt = LSIZE0;                                                                 \
    i64 s0 = 0;                                                                            \
    i64 s1 = 0;                                                                            \
    i64 amp = 0;                                                                           \
    const int active = toast_amp_samples(det, det_end, iv, iv_end, GRP0, intervals,       \
                                         step_length, det < det_end ? amp_offset[det] : -1, \
                                         view_offset, amplitude_flags, &s0, &s1, &amp);
KERNEL void toast_template_offset_project_signal(
    TOAST_GRID_ARGS, i64 n_samp, GLOBAL const i64 *RESTRICT intervals,
    GLOBAL const i32 *RESTRICT data_index, GLOBAL const i32 *RESTRICT flag_index,
    i64 step_length, GLOBAL const i64 *RESTRICT amp_offset,
    GLOBAL const i64 *RESTRICT view_offset, GLOBAL const double *RESTRICT det_data,
    GLOBAL const u8 *RESTRICT flag_data, i32 flag_mask, GLOBAL double *RESTRICT amplitudes,
    GLOBAL const u8 *RESTRICT amplitude_flags) {
    TOAST_AMP_BLOCK
    double x = 0.0;
    if (active) {
        const i64 drow = (i64)data_index[det] * n_samp;
        const i32 fi = flag_index[det];
        if (fi >= 0) {
            const i64 frow = (i64)fi * n_samp;
            for (i64 s = s0 + t; s < s1; s += nt) {
                x += (flag_data[frow + s] & flag_mask) == 0 ? det_data[drow + s] : 0.0;
            }
        } else {
            for (i64 s = s0 + t; s < s1; s += nt) {
                x += det_data[drow + s];
            }
        }
    }
    red[t] = x;
    BLOCK_BARRIER();
    toast_block_sum_rows(red, 1);
    if (active && t == 0) {
        amplitudes[amp] += red[0];
    }
}

/* ---- 10. template_offset_apply_diag_precond ---------------------------- */

/* 1-D over amplitudes; amplitudes_in may be amplitudes_out (element-wise). */
KERNEL void toast_template_offset_apply_diag_precond(i64 n_amp,
                                                     GLOBAL const double *offset_var,
                                                     GLOBAL const double *amplitudes_in,
                                                     GLOBAL const u8 *amplitude_flags,
                                                     GLOBAL double *amplitudes_out) {
    const i64 a = GID0;
    if (a >= n_amp) {
        return;
    }
    amplitudes_out[a] = amplitude_flags[a] == 0 ? amplitudes_in[a] * offset_var[a] : 0.0;
}

/* ======================================================================== *
 * The four kernels below (appended to the plugin table in ABI minor 1;
 * toast-gpu's entries.rs plans their launches); their CPU twins are
 * backend-cpu/src/kernels/{mapmaker_utils,polyfilter}.rs.  None of them
 * takes TOAST_GRID_ARGS: their launch shapes are given with each.
 * ======================================================================== */

/* ---- 11. cov_accum_diag_hits (atomic accumulation) --------------------- */

/* The flat local pixel of sample i into *hpx: 1 to accumulate it, 0 to skip
 * it (nsub < 1, as TOAST returns at once; a negative submap: not local; a
 * negative pixel: flagged).  A submap >= nsub or pixel >= nsubpix records
 * the error key (0, i) and skips. */
DEVICE_FN int toast_cov_pixel(i64 i, i64 nsub, i64 nsubpix, GLOBAL const i64 *RESTRICT submap,
                              GLOBAL const i64 *RESTRICT subpix, GLOBAL u64 *RESTRICT err,
                              i64 *hpx) {
    if (nsub < 1) {
        return 0;
    }
    const i64 sm = submap[i];
    const i64 px = subpix[i];
    if (sm < 0 || px < 0) {
        return 0;
    }
    if (sm >= nsub || px >= nsubpix) {
        atomic_min_u64(err, TOAST_ERR_KEY(0, i));
        return 0;
    }
    *hpx = sm * nsubpix + px;
    return 1;
}

/* 1-D over samples i < nsamp.  hits[submap[i] * nsubpix + subpix[i]] += 1
 * for a sample with a non-negative submap and pixel (a negative one is a
 * submap not local to this process, or a flagged sample).  nsub < 1 does
 * nothing, as in TOAST.  A submap >= nsub or pixel >= nsubpix is an error,
 * key (0, i).  Integer atomics: the result is exact in any order. */
KERNEL void toast_cov_accum_diag_hits(i64 nsamp, i64 nsub, i64 nsubpix,
                                      GLOBAL const i64 *RESTRICT submap,
                                      GLOBAL const i64 *RESTRICT subpix,
                                      GLOBAL i64 *RESTRICT hits, GLOBAL u64 *RESTRICT err) {
    const i64 i = GID0;
    i64 hpx = 0;
    if (i < nsamp && toast_cov_pixel(i, nsub, nsubpix, submap, subpix, err, &hpx)) {
        atomic_add_i64(&hits[hpx], 1);
    }
}

/* ---- 12. cov_accum_diag_invnpp (atomic accumulation) ------------------- */

/* 1-D over samples, as cov_accum_diag_hits.  Pixel hpx's block of
 * nnz (nnz + 1) / 2 elements (the lower triangle, row by row) gets
 * w[k] * (w[j] * scale) for j <= k, w = weights[i * nnz ..].  The products
 * are TOAST's; the summation order across samples is the atomics', so the
 * last bits of a pixel hit several times are not deterministic (the CPU
 * sums in sample order). */
KERNEL void toast_cov_accum_diag_invnpp(i64 nsamp, i64 nsub, i64 nsubpix, i64 nnz,
                                        GLOBAL const i64 *RESTRICT submap,
                                        GLOBAL const i64 *RESTRICT subpix,
                                        GLOBAL const double *RESTRICT weights, double scale,
                                        GLOBAL double *RESTRICT invnpp,
                                        GLOBAL u64 *RESTRICT err) {
    const i64 i = GID0;
    i64 hpx = 0;
    if (i >= nsamp || !toast_cov_pixel(i, nsub, nsubpix, submap, subpix, err, &hpx)) {
        return;
    }
    i64 c = hpx * (nnz * (nnz + 1) / 2);
    const i64 wo = i * nnz;
    for (i64 j = 0; j < nnz; j++) {
        const double scaled_weight = weights[wo + j] * scale;
        for (i64 k = j; k < nnz; k++) {
            atomic_add_f64(&invnpp[c], weights[wo + k] * scaled_weight);
            c++;
        }
    }
}

/* ---- the polynomial filters: one block per fit ------------------------- */

/* Both filters decompose with one block (work-group) per matrix: its
 * threads load the samples (or detectors) of the fit together, build the
 * normal matrix cooperatively and diagonalise it together; fits are batched
 * over the grid (the signals and scans of filter_polynomial, which also
 * solves in the block; the (sample, group) heads of filter_poly2D, whose
 * solves are a thread's each, section 14).  A fit has up to toast_accel::check::MAX_POLY_TEMPLATES
 * templates, too many for shared memory: the matrix, its eigenvectors and
 * the vectors live in the block's slice of a global workspace that the host
 * allocates for the launch (toast-gpu's kernels::entries), element e of the
 * slice at ws[e * s]: s = 1 (contiguous) or the slices of the launch
 * (interleaved; plugin option `workspace`).  The slice is a (n * n),
 * v (n * n), then the vectors of the kernel (n each; filter_poly2D also a
 * head mark).  The small arrays the
 * threads exchange (partial sums, the current rotation) are block-shared.
 * Blocks have at most TOAST_FIT_THREADS threads (the host launches that
 * many); the kernels work for any block size up to it. */
#define TOAST_FIT_THREADS 128
/* Templates per tile of filter_polynomial's normal matrix: each thread
 * keeps TILE x TILE partial sums in registers. */
#define TOAST_FIT_TILE 8
#define TOAST_JACOBI_MAX_SWEEPS 64

/* Diagonalise the symmetric n x n row-major a (a[(r * n + c) * s]) by the
 * cyclic Jacobi method, the block together: the eigenvalues end on the
 * diagonal of a, the eigenvectors in the columns of v (v[(k * n + i) * s]).
 * The same operations, in the same order, as backend-cpu's
 * polyfilter::jacobi_eigen (+ - * / sqrt fabs and comparisons only, all
 * exact or correctly rounded), so the CPU and every device give the same
 * bits: thread 0 decides each rotation (p, q) and updates the four
 * elements of rows and columns p and q that only it touches, then the
 * block applies it to the other rows k (each element updated by one thread
 * from values no other thread writes in that rotation), two barriers per
 * pair.  rot (12 values, block-shared) carries the rotation (alternating
 * between two slots) and the sweep's "rotated" flag.  Every thread of the
 * block must call it. */
#define TOAST_A(r, c) a[((i64)(r) * n + (c)) * s]
#define TOAST_V(r, c) v[((i64)(r) * n + (c)) * s]
DEVICE_FN void toast_jacobi_eigen_block(int n, GLOBAL double *a, GLOBAL double *v, i64 s,
                                        SHARED double *rot) {
    const i64 t = LID0;
    const i64 nt = LSIZE0;
    for (i64 e = t; e < (i64)n * n; e += nt) {
        v[e * s] = e / n == e % n ? 1.0 : 0.0;
    }
    BLOCK_BARRIER();
    /* The pairs (p, q), p < q, in row order, as one loop (one barrier
     * loop for OpenCL implementations that turn work-items into loops). */
    const i64 npair = (i64)n * (n - 1) / 2;
    for (int sweep = 0; sweep < TOAST_JACOBI_MAX_SWEEPS; sweep++) {
        if (t == 0) {
            rot[8] = 0.0;
        }
        int p = 0;
        int q = 1;
        for (i64 pair = 0; pair < npair; pair++) {
            SHARED double *r = rot + 4 * (pair & 1);
            if (t == 0) {
                double act = 0.0;
                const double apq = TOAST_A(p, q);
                if (apq != 0.0) {
                    const double app = TOAST_A(p, p);
                    const double aqq = TOAST_A(q, q);
                    const double g = 100.0 * fabs(apq);
                    if (fabs(app) + g == fabs(app) && fabs(aqq) + g == fabs(aqq)) {
                        TOAST_A(p, q) = 0.0;
                        TOAST_A(q, p) = 0.0;
                    } else {
                        const double h = aqq - app;
                        double tn;
                        if (fabs(h) + g == fabs(h)) {
                            tn = apq / h;
                        } else {
                            const double theta = 0.5 * h / apq;
                            tn = 1.0 / (fabs(theta) + sqrt(1.0 + theta * theta));
                            if (theta < 0.0) {
                                tn = -tn;
                            }
                        }
                        const double c = 1.0 / sqrt(1.0 + tn * tn);
                        r[1] = c;
                        r[2] = tn * c;
                        TOAST_A(p, p) = app - tn * apq;
                        TOAST_A(q, q) = aqq + tn * apq;
                        TOAST_A(p, q) = 0.0;
                        TOAST_A(q, p) = 0.0;
                        act = 1.0;
                        rot[8] = 1.0;
                    }
                }
                r[0] = act;
            }
            BLOCK_BARRIER();
            if (r[0] != 0.0) {
                const double c = r[1];
                const double sn = r[2];
                for (i64 k = t; k < n; k += nt) {
                    if (k == p || k == q) {
                        continue;
                    }
                    const double akp = TOAST_A(k, p);
                    const double akq = TOAST_A(k, q);
                    const double nkp = c * akp - sn * akq;
                    const double nkq = sn * akp + c * akq;
                    TOAST_A(k, p) = nkp;
                    TOAST_A(p, k) = nkp;
                    TOAST_A(k, q) = nkq;
                    TOAST_A(q, k) = nkq;
                }
                for (i64 k = t; k < n; k += nt) {
                    const double vkp = TOAST_V(k, p);
                    const double vkq = TOAST_V(k, q);
                    TOAST_V(k, p) = c * vkp - sn * vkq;
                    TOAST_V(k, q) = sn * vkp + c * vkq;
                }
            }
            BLOCK_BARRIER();
            q++;
            if (q == n) {
                p++;
                q = p + 1;
            }
        }
        BLOCK_BARRIER();
        const int rotated = rot[8] != 0.0;
        BLOCK_BARRIER();
        if (!rotated) {
            break;
        }
    }
}

/* b <- pinv(A) b from toast_jacobi_eigen_block's a and v, keeping the
 * eigenvalues whose magnitude exceeds max(rcond * largest magnitude,
 * DBL_MIN), as LAPACK dgelss keeps singular values; w is scratch of n; all
 * of stride s.  Each element is one thread's sum in index order, as in
 * polyfilter::pinv_apply.  Every thread of the block must call it (it ends
 * with a barrier). */
DEVICE_FN void toast_pinv_apply_block(int n, GLOBAL const double *a, GLOBAL const double *v,
                                      i64 s, double rcond, GLOBAL double *b, GLOBAL double *w) {
    const i64 t = LID0;
    const i64 nt = LSIZE0;
    double smax = 0.0;
    for (int i = 0; i < n; i++) {
        const double d = fabs(TOAST_A(i, i));
        if (d > smax) {
            smax = d;
        }
    }
    double thr = rcond * smax;
    if (thr < 2.2250738585072014e-308) {
        thr = 2.2250738585072014e-308;
    }
    for (i64 i = t; i < n; i += nt) {
        double x = 0.0;
        for (int k = 0; k < n; k++) {
            x += TOAST_V(k, i) * b[k * s];
        }
        const double l = TOAST_A(i, i);
        w[i * s] = fabs(l) > thr ? x / l : 0.0;
    }
    BLOCK_BARRIER();
    for (i64 k = t; k < n; k += nt) {
        double x = 0.0;
        for (int i = 0; i < n; i++) {
            x += TOAST_V(k, i) * w[i * s];
        }
        b[k * s] = x;
    }
    BLOCK_BARRIER();
}
#undef TOAST_A
#undef TOAST_V

/* P_k(x) from P_{k-1} and P_{k-2} by TOAST's recurrence
 * (polyfilter::legendre): P_0 = 1, P_1 = x. */
DEVICE_FN double toast_legendre_next(int k, double x, double pm1, double pm2) {
    if (k == 0) {
        return 1.0;
    }
    if (k == 1) {
        return x;
    }
    const double orderinv = 1.0 / (double)k;
    return ((double)(2 * k - 1) * x * pm1 - (double)(k - 1) * pm2) * orderinv;
}

/* ---- 13. filter_polynomial --------------------------------------------- */

/* Grid of blocks: dimension 0 the signal k0 + GRP0 < k_end (row
 * signal_index[k] of signals, n_samp per row), dimension 1 the scan
 * iv0 + GRP1 < iv_end; one block fits its signal on its scan.  scans holds
 * TOAST's (start, stop) pairs, stop exclusive, clamped here as TOAST does
 * (start < 0 -> 0; stop < 0 or > n_samp -> n_samp; stop < start skips).
 * Thread t takes samples t, t + LSIZE0, ... of the scan (consecutive
 * threads, consecutive samples).  The good samples (flags == 0) are
 * counted; norder = min(order + 1, good samples), a scan with none is left
 * alone.  The Legendre normal matrix G and the right-hand side R (the
 * signal as column norder) are built tile by tile (TOAST_FIT_TILE x
 * TOAST_FIT_TILE entries, each thread's partial sums in registers, the
 * Legendre values by the recurrence), each entry the block's tree sum
 * (toast_block_sum_rows) of the threads' sums in sample order: not the
 * CPU's sequential order, so the result differs from the CPU's in the last
 * bits (within the tolerance against TOAST, FORMAT.md section 13), the same
 * on every device for the same block size.  Then the pseudo-inverse solve
 * with rcond DBL_EPSILON by the block, and the subtraction from every sample
 * of the scan, flagged or not.  Scans that overlap must be launched one at
 * a time, in order (the second fits what the first left).  Block
 * GRP0 + GRP1 * (k_end - k0) owns the workspace slice at
 * work + slot * item_step, of stride elem_step and
 * 2 (order + 1)^2 + 3 (order + 1) elements (a, v, amp, w, unused). */
KERNEL void toast_filter_polynomial(i64 k0, i64 k_end, i64 iv0, i64 iv_end, i64 n_samp, i64 order,
                                    GLOBAL const i64 *RESTRICT scans,
                                    GLOBAL const u8 *RESTRICT flags,
                                    GLOBAL const i32 *RESTRICT signal_index,
                                    GLOBAL double *RESTRICT signals,
                                    GLOBAL double *RESTRICT work, i64 item_step, i64 elem_step) {
    BLOCK_SHARED(double, red, TOAST_FIT_TILE * TOAST_FIT_THREADS);
    BLOCK_SHARED(double, rot, 12);
    const i64 k = k0 + GRP0;
    const i64 iv = iv0 + GRP1;
    if (k >= k_end || iv >= iv_end || order < 0 || LSIZE0 > TOAST_FIT_THREADS) {
        return;
    }
    i64 start = scans[2 * iv];
    i64 stop = scans[2 * iv + 1];
    if (start < 0) {
        start = 0;
    }
    if (stop < 0 || stop > n_samp) {
        stop = n_samp;
    }
    if (stop < start) {
        return;
    }
    const i64 t = LID0;
    const i64 nt = LSIZE0;
    const i64 len = stop - start;
    GLOBAL const u8 *f = flags + start;
    i64 c = 0;
    for (i64 i = t; i < len; i += nt) {
        if (f[i] == 0) {
            c++;
        }
    }
    red[t] = (double)c;
    BLOCK_BARRIER();
    toast_block_sum_rows(red, 1);
    const i64 ngood = (i64)red[0];
    BLOCK_BARRIER();
    if (ngood == 0) {
        return;
    }
    const int n = (int)(order >= ngood ? ngood : order + 1);
    const i64 s = elem_step;
    const i64 m = order + 1;
    GLOBAL double *a = work + ((i64)GRP0 + (i64)GRP1 * (k_end - k0)) * item_step;
    GLOBAL double *v = a + m * m * s;
    GLOBAL double *amp = v + m * m * s;
    GLOBAL double *w = amp + m * s;
    const double dx = 2.0 / (double)len;
    const double xstart = 0.5 * dx - 1.0;
    GLOBAL double *sig = signals + (i64)signal_index[k] * n_samp + start;
    /* Row tiles over the templates, column tiles over the templates and
     * the signal (column n); only tiles on or above the diagonal. */
    const int nrt = (n + TOAST_FIT_TILE - 1) / TOAST_FIT_TILE;
    const int nct = (n + TOAST_FIT_TILE) / TOAST_FIT_TILE;
    for (int jt = 0; jt < nrt; jt++) {
        for (int lt = jt; lt < nct; lt++) {
            const int j0 = jt * TOAST_FIT_TILE;
            const int l0 = lt * TOAST_FIT_TILE;
            const int kmax = l0 + TOAST_FIT_TILE < n ? l0 + TOAST_FIT_TILE : n;
            double acc[TOAST_FIT_TILE * TOAST_FIT_TILE];
            for (int e = 0; e < TOAST_FIT_TILE * TOAST_FIT_TILE; e++) {
                acc[e] = 0.0;
            }
            for (i64 i = t; i < len; i += nt) {
                if (f[i] != 0) {
                    continue;
                }
                const double x = xstart + (double)i * dx;
                double pj[TOAST_FIT_TILE];
                double pl[TOAST_FIT_TILE];
                for (int e = 0; e < TOAST_FIT_TILE; e++) {
                    pj[e] = 0.0;
                    pl[e] = 0.0;
                }
                double pm1 = 0.0;
                double pm2 = 0.0;
                for (int q = 0; q < kmax; q++) {
                    const double pk = toast_legendre_next(q, x, pm1, pm2);
                    for (int e = 0; e < TOAST_FIT_TILE; e++) {
                        if (q == j0 + e) {
                            pj[e] = pk;
                        }
                        if (q == l0 + e) {
                            pl[e] = pk;
                        }
                    }
                    pm2 = pm1;
                    pm1 = pk;
                }
                const double sv = sig[i];
                for (int e = 0; e < TOAST_FIT_TILE; e++) {
                    if (n == l0 + e) {
                        pl[e] = sv;
                    }
                }
                for (int jj = 0; jj < TOAST_FIT_TILE; jj++) {
                    for (int ll = 0; ll < TOAST_FIT_TILE; ll++) {
                        acc[jj * TOAST_FIT_TILE + ll] += pj[jj] * pl[ll];
                    }
                }
            }
            for (int jj = 0; jj < TOAST_FIT_TILE; jj++) {
                const int j = j0 + jj;
                for (int ll = 0; ll < TOAST_FIT_TILE; ll++) {
                    red[ll * nt + t] = acc[jj * TOAST_FIT_TILE + ll];
                }
                BLOCK_BARRIER();
                toast_block_sum_rows(red, TOAST_FIT_TILE);
                if (t == 0 && j < n) {
                    for (int ll = 0; ll < TOAST_FIT_TILE; ll++) {
                        const int l = l0 + ll;
                        const double sum = red[ll * nt];
                        if (l == n) {
                            amp[j * s] = sum;
                        } else if (l >= j && l < n) {
                            a[((i64)j * n + l) * s] = sum;
                            a[((i64)l * n + j) * s] = sum;
                        }
                    }
                }
                BLOCK_BARRIER();
            }
        }
    }
    toast_jacobi_eigen_block(n, a, v, s, rot);
    toast_pinv_apply_block(n, a, v, s, 2.220446049250313e-16, amp, w);
    for (i64 i = t; i < len; i += nt) {
        const double x = xstart + (double)i * dx;
        double sv = sig[i];
        double pm1 = 0.0;
        double pm2 = 0.0;
        for (int q = 0; q < n; q++) {
            const double pk = toast_legendre_next(q, x, pm1, pm2);
            sv -= amp[q * s] * pk;
            pm2 = pm1;
            pm1 = pk;
        }
        sig[i] = sv;
    }
}

/* ---- 14. filter_poly2D ------------------------------------------------- */

/* Three launches per chunk of the (sample, group) grid (samples
 * s0 <= isamp < s_end, groups g0 <= igroup < g_end), as the CPU computes:
 * the normal matrix of a sample and group depends only on the templates and
 * on which of the group's detectors (det_groups[d] == igroup) are good
 * (masks[isamp, d] != 0; a mask weighs by exactly 0.0 or 1.0), so it is
 * decomposed only at the group's "heads", where that set changes, and every
 * sample of a run reuses its head's eigenvalues and eigenvectors: the same
 * bits as decomposing again, and the same bits as the CPU (which keeps a
 * group's decomposition while its mask is unchanged).
 *   1. toast_filter_poly2d_heads, a thread per (sample, group), marks the
 *      heads: the chunk's first sample (a chunk never reads another chunk's
 *      workspace), every TOAST_POLY2D_RUN-th sample after it (so that a
 *      sample finds its head within TOAST_POLY2D_RUN steps: O(n) in all,
 *      however long a mask stays unchanged), and a sample whose group mask
 *      differs from the previous sample's.
 *   2. toast_filter_poly2d, a block per (sample, group), returns at once
 *      (the whole block, before any barrier) unless its sample is a head;
 *      a head's block builds TOAST's masked normal matrix (thread t owns
 *      elements t, t + LSIZE0, ..., each summed over the members in index
 *      order, (t_i t_j) m, exactly as the CPU) and diagonalises it
 *      (toast_jacobi_eigen_block).
 *   3. toast_filter_poly2d_solve, a thread per (sample, group), walks back
 *      to its head, builds the right-hand side in TOAST's order,
 *      (t_i s) m over the members in index order (a masked detector weighs
 *      0.0, so a NaN signal there still poisons the fit as in TOAST),
 *      directly in coeff[isamp, igroup, 0..n_mode], and applies the
 *      pseudo-inverse (rcond 1e-6) with its head's a and v in place: the
 *      operations of polyfilter::pinv_apply in its order.
 * (Barriers stay out of data-dependent branches inside a block: PoCL 3.1
 * miscompiled a block walking a run of samples with its barriers under the
 * run's branches: heap corruption.  Step 2's return is the whole block's,
 * from one value all its threads read.)  The host has checked every group
 * is below n_group.  Grid point (isamp, igroup) owns the workspace slice
 * toast_poly2d_slot at work + slot * item_step, of stride elem_step and
 * 2 n_mode^2 + n_mode + 1 elements: a, v (a head's decomposition), w (the
 * solve's scratch), and the head mark (1.0 at a head, else 0.0). */
#define TOAST_POLY2D_RUN 256

DEVICE_FN GLOBAL double *toast_poly2d_slot(GLOBAL double *work, i64 item_step, i64 s0, i64 s_end,
                                           i64 g0, i64 isamp, i64 igroup) {
    return work + ((isamp - s0) + (igroup - g0) * (s_end - s0)) * item_step;
}

/* Grid: dimension 0 the sample s0 + GID0 < s_end, dimension 1 the group
 * g0 + GID1 < g_end.  Writes the head mark of the grid point's slice. */
KERNEL void toast_filter_poly2d_heads(i64 s0, i64 s_end, i64 g0, i64 g_end, i64 n_det,
                                      i64 n_mode, GLOBAL const i32 *RESTRICT det_groups,
                                      GLOBAL const u8 *RESTRICT masks,
                                      GLOBAL double *RESTRICT work, i64 item_step,
                                      i64 elem_step) {
    const i64 isamp = s0 + GID0;
    const i64 igroup = g0 + GID1;
    if (isamp >= s_end || igroup >= g_end || n_mode < 1) {
        return;
    }
    int head = isamp == s0 || (isamp - s0) % TOAST_POLY2D_RUN == 0;
    for (i64 d = 0; d < n_det && !head; d++) {
        if ((i64)det_groups[d] == igroup &&
            (masks[isamp * n_det + d] != 0) != (masks[(isamp - 1) * n_det + d] != 0)) {
            head = 1;
        }
    }
    GLOBAL double *slot = toast_poly2d_slot(work, item_step, s0, s_end, g0, isamp, igroup);
    slot[(2 * n_mode * n_mode + n_mode) * elem_step] = head ? 1.0 : 0.0;
}

/* Grid of blocks: dimension 0 the sample s0 + GRP0 < s_end, dimension 1
 * the group g0 + GRP1 < g_end; a head's block decomposes its matrix into
 * the a and v of its slice (see above). */
KERNEL void toast_filter_poly2d(i64 s0, i64 s_end, i64 g0, i64 g_end, i64 n_det, i64 n_mode,
                                GLOBAL const i32 *RESTRICT det_groups,
                                GLOBAL const double *RESTRICT templates,
                                GLOBAL const u8 *RESTRICT masks, GLOBAL double *RESTRICT work,
                                i64 item_step, i64 elem_step) {
    BLOCK_SHARED(double, rot, 12);
    const i64 isamp = s0 + GRP0;
    const i64 igroup = g0 + GRP1;
    if (isamp >= s_end || igroup >= g_end || n_mode < 1) {
        return;
    }
    const i64 s = elem_step;
    GLOBAL double *a = toast_poly2d_slot(work, item_step, s0, s_end, g0, isamp, igroup);
    if (a[(2 * n_mode * n_mode + n_mode) * s] == 0.0) {
        return;
    }
    const i64 t = LID0;
    const i64 nt = LSIZE0;
    const int n = (int)n_mode;
    GLOBAL double *v = a + n_mode * n_mode * s;
    for (i64 e = t; e < n_mode * n_mode; e += nt) {
        a[e * s] = 0.0;
    }
    for (i64 d = 0; d < n_det; d++) {
        if ((i64)det_groups[d] != igroup) {
            continue;
        }
        const double det_mask = masks[isamp * n_det + d] == 0 ? 0.0 : 1.0;
        GLOBAL const double *tp = templates + d * n_mode;
        for (i64 e = t; e < n_mode * n_mode; e += nt) {
            const i64 r = e / n_mode;
            const i64 c = e % n_mode;
            const i64 lo = r < c ? r : c;
            const i64 hi = r < c ? c : r;
            a[e * s] += tp[lo] * tp[hi] * det_mask;
        }
    }
    BLOCK_BARRIER();
    toast_jacobi_eigen_block(n, a, v, s, rot);
}

/* Grid: dimension 0 the sample s0 + GID0 < s_end, dimension 1 the group
 * g0 + GID1 < g_end.  The right-hand side and the pseudo-inverse solve of
 * the grid point with its head's decomposition (see above): b is the
 * point's row of coeff (stride 1), w its slice's (stride elem_step), and
 * the thresholds and sums those of toast_pinv_apply_block, one thread
 * doing every element in index order. */
KERNEL void toast_filter_poly2d_solve(i64 s0, i64 s_end, i64 g0, i64 g_end, i64 n_det,
                                      i64 n_group, i64 n_mode,
                                      GLOBAL const i32 *RESTRICT det_groups,
                                      GLOBAL const double *RESTRICT templates,
                                      GLOBAL const double *RESTRICT signals,
                                      GLOBAL const u8 *RESTRICT masks,
                                      GLOBAL double *RESTRICT coeff,
                                      GLOBAL double *RESTRICT work, i64 item_step,
                                      i64 elem_step) {
    const i64 isamp = s0 + GID0;
    const i64 igroup = g0 + GID1;
    if (isamp >= s_end || igroup >= g_end || n_mode < 1) {
        return;
    }
    const i64 s = elem_step;
    const i64 mark = (2 * n_mode * n_mode + n_mode) * s;
    /* The chunk's first sample is a head, and one at least every
     * TOAST_POLY2D_RUN samples after it. */
    i64 head = isamp;
    while (toast_poly2d_slot(work, item_step, s0, s_end, g0, head, igroup)[mark] == 0.0) {
        head--;
    }
    GLOBAL const double *a = toast_poly2d_slot(work, item_step, s0, s_end, g0, head, igroup);
    GLOBAL const double *v = a + n_mode * n_mode * s;
    GLOBAL double *w =
        toast_poly2d_slot(work, item_step, s0, s_end, g0, isamp, igroup) + 2 * n_mode * n_mode * s;
    GLOBAL double *b = coeff + (isamp * n_group + igroup) * n_mode;
    for (i64 im = 0; im < n_mode; im++) {
        b[im] = 0.0;
    }
    for (i64 d = 0; d < n_det; d++) {
        if ((i64)det_groups[d] != igroup) {
            continue;
        }
        const double det_mask = masks[isamp * n_det + d] == 0 ? 0.0 : 1.0;
        const double det_sig = signals[isamp * n_det + d];
        GLOBAL const double *tp = templates + d * n_mode;
        for (i64 im = 0; im < n_mode; im++) {
            b[im] += tp[im] * det_sig * det_mask;
        }
    }
    const i64 n = n_mode;
    double smax = 0.0;
    for (i64 i = 0; i < n; i++) {
        const double d = fabs(a[(i * n + i) * s]);
        if (d > smax) {
            smax = d;
        }
    }
    double thr = 1e-6 * smax;
    if (thr < 2.2250738585072014e-308) {
        thr = 2.2250738585072014e-308;
    }
    for (i64 i = 0; i < n; i++) {
        double x = 0.0;
        for (i64 k = 0; k < n; k++) {
            x += v[(k * n + i) * s] * b[k];
        }
        const double l = a[(i * n + i) * s];
        w[i * s] = fabs(l) > thr ? x / l : 0.0;
    }
    for (i64 k = 0; k < n; k++) {
        double x = 0.0;
        for (i64 i = 0; i < n; i++) {
            x += v[(k * n + i) * s] * w[i * s];
        }
        b[k] = x;
    }
}

/* ---- 15. cov_apply_diag (ABI minor 2) ----------------------------------- */

/* 1-D over the npix = nsub * nsubpix local pixels (the host launches only
 * for nsub >= 1 and checks 1 <= nnz <= 16).  vec[p] <- mat[p] vec[p], mat
 * the packed symmetric matrix row by row (nnz (nnz + 1) / 2 values), in
 * TOAST's order: t[j] += m[jk] v[k], and t[k] += m[jk] v[j] off the
 * diagonal.  One thread per pixel writes only its pixel: exact. */
KERNEL void toast_cov_apply_diag(i64 npix, i64 nnz, GLOBAL const double *RESTRICT mat,
                                 GLOBAL double *RESTRICT vec) {
    const i64 p = GID0;
    if (p >= npix) {
        return;
    }
    const i64 block = nnz * (nnz + 1) / 2;
    GLOBAL const double *m = mat + p * block;
    GLOBAL double *v = vec + p * nnz;
    double t[16];
    for (i64 j = 0; j < nnz; j++) {
        t[j] = 0.0;
    }
    i64 off = 0;
    for (i64 j = 0; j < nnz; j++) {
        for (i64 k = j; k < nnz; k++) {
            t[j] += m[off] * v[k];
            if (k != j) {
                t[k] += m[off] * v[j];
            }
            off++;
        }
    }
    for (i64 j = 0; j < nnz; j++) {
        v[j] = t[j];
    }
}

/* ---- 16-17. amp_dot, amp_axpby (ABI minor 3) --------------------------- */

/* The PCG solver's amplitude-vector kernels (not TOAST registry kernels).
 * amp_dot: 1-D over the nblock partial sums; thread k sums, in index order
 * from 0.0, a[i] * b[i] over the unflagged entries of its block
 * [k chunk, min(n, (k + 1) chunk)), chunk = ceil(n / nblock) (the host
 * passes it), skipping flagged ones.  Each thread writes only its partial
 * and sums in a fixed order: deterministic, and the host adds the
 * partials in order. */
KERNEL void toast_amp_dot(i64 n, i64 nblock, i64 chunk, GLOBAL const double *RESTRICT a,
                          GLOBAL const double *RESTRICT b, GLOBAL const u8 *RESTRICT flags,
                          GLOBAL double *RESTRICT partials) {
    const i64 k = GID0;
    if (k >= nblock) {
        return;
    }
    i64 lo = k * chunk;
    if (lo > n) {
        lo = n;
    }
    i64 hi = lo + chunk;
    if (hi > n) {
        hi = n;
    }
    double s = 0.0;
    for (i64 i = lo; i < hi; i++) {
        if (flags[i] == 0) {
            s += a[i] * b[i];
        }
    }
    partials[k] = s;
}

/* amp_axpby: 1-D over the n entries, y[i] <- (alpha x[i]) + (beta y[i]);
 * beta == 0: y[i] <- alpha x[i] (y not read, as BLAS: an exact copy). */
KERNEL void toast_amp_axpby(i64 n, double alpha, double beta, GLOBAL const double *RESTRICT x,
                            GLOBAL double *RESTRICT y) {
    const i64 i = GID0;
    if (i >= n) {
        return;
    }
    if (beta == 0.0) {
        y[i] = alpha * x[i];
    } else {
        y[i] = alpha * x[i] + beta * y[i];
    }
}

/* ======================================================================
 * The map-maker's fused kernels (ABI minor 4): compact_expand_pointing,
 * fused_accumulate, fused_project.  The pointing comes in two forms: compact
 * (an i32 pixel; the IQU weights rebuilt from the boresight, the focal-plane
 * quaternion and epsilon/gamma/cal by toast_compact_weights) or kept (i64
 * pixels, IQU weights).  The rebuilt weights use the rational double angle
 * of the CPU plugin (backend-cpu kernels/compact.rs), the same operations
 * (+ - * / sqrt, contraction off, so the same bits as the CPU where it
 * applies), and stokes_weights_IQU's atan2/cos/sin where it does not and
 * with a HWP.  fused_accumulate accumulates with atomics (as
 * build_noise_weighted); fused_project sums each amplitude's samples in
 * one block (as template_offset_project_signal).  The two
 * passes' parameters are the same up to det_mask (one marshalling prefix in
 * toast-gpu), then their own.
 * ====================================================================== */

/* The IQU weights of sample s of a detector (compact form) into w. */
DEVICE_FN void toast_compact_weights(GLOBAL const double *RESTRICT boresight,
                                     GLOBAL const u8 *RESTRICT pflags, i32 use_pflags,
                                     i32 pmask, GLOBAL const double *RESTRICT hwp,
                                     i32 use_hwp, i64 s, const double *fp, double eta,
                                     double c, double gamma, double u_sign, double *w) {
    double p[4];
    if (use_pflags && (pflags[s] & pmask) != 0) {
        p[0] = 0.0;
        p[1] = 0.0;
        p[2] = 0.0;
        p[3] = 1.0;
    } else {
        p[0] = boresight[4 * s];
        p[1] = boresight[4 * s + 1];
        p[2] = boresight[4 * s + 2];
        p[3] = boresight[4 * s + 3];
    }
    double q[4];
    q[0] = p[0] * fp[3] + p[1] * fp[2] - p[2] * fp[1] + p[3] * fp[0];
    q[1] = -p[0] * fp[2] + p[1] * fp[3] + p[2] * fp[0] + p[3] * fp[1];
    q[2] = p[0] * fp[1] - p[1] * fp[0] + p[2] * fp[3] + p[3] * fp[2];
    q[3] = -p[0] * fp[0] - p[1] * fp[1] - p[2] * fp[2] + p[3] * fp[3];
    w[0] = c;
    if (use_hwp) {
        double ang = 2.0 * (2.0 * (gamma - hwp[s]) - toast_stokes_alpha(q));
        w[1] = cos(ang) * eta * c;
        w[2] = -sin(ang) * eta * c * u_sign;
        return;
    }
    const double zaxis[3] = {0.0, 0.0, 1.0};
    const double xaxis[3] = {1.0, 0.0, 0.0};
    double vd[3];
    double vo[3];
    toast_qa_rotate(q, zaxis, vd);
    toast_qa_rotate(q, xaxis, vo);
    double r = sqrt(vd[0] * vd[0] + vd[1] * vd[1]);
    double vm_z = -sqrt(1.0 - vd[2] * vd[2]);
    double inv_r = 1.0 / r;
    double vm_x = vd[2] * (vd[0] * inv_r);
    double vm_y = vd[2] * (vd[1] * inv_r);
    double y = vd[0] * (vm_y * vo[2] - vm_z * vo[1]) - vd[1] * (vm_x * vo[2] - vm_z * vo[0]) +
               vd[2] * (vm_x * vo[1] - vm_y * vo[0]);
    double x = vm_x * vo[0] + vm_y * vo[1] + vm_z * vo[2];
    double n = x * x + y * y;
    double inv_n = 1.0 / n;
    double cang;
    double sang;
    /* n - n == 0: n is finite. */
    if (r > 0.0 && n > 0.0 && n - n == 0.0) {
        cang = (x * x - y * y) * inv_n;
        sang = (2.0 * x * y) * inv_n;
    } else {
        double ang = toast_stokes_alpha(q) * 2.0;
        cang = cos(ang);
        sang = sin(ang);
    }
    w[1] = cang * eta * c;
    w[2] = sang * eta * c * u_sign;
}

/* The pixel and IQU weights of sample s of detector det, in either form. */
DEVICE_FN i64 toast_fused_pointing(
    i64 det, i64 s, i64 n_samp, i32 compact_form, GLOBAL const i32 *RESTRICT pixel_index,
    GLOBAL const i32 *RESTRICT weight_index, GLOBAL const double *RESTRICT focalplane,
    GLOBAL const double *RESTRICT epsilon, GLOBAL const double *RESTRICT gamma,
    GLOBAL const double *RESTRICT cal, GLOBAL const i32 *RESTRICT compact,
    GLOBAL const double *RESTRICT boresight, GLOBAL const u8 *RESTRICT pflags, i32 use_pflags,
    i32 pmask, GLOBAL const double *RESTRICT hwp, i32 use_hwp, i32 iau,
    GLOBAL const i64 *RESTRICT pixels, GLOBAL const double *RESTRICT weights, double *w) {
    if (compact_form) {
        double fp[4];
        fp[0] = focalplane[4 * det];
        fp[1] = focalplane[4 * det + 1];
        fp[2] = focalplane[4 * det + 2];
        fp[3] = focalplane[4 * det + 3];
        const double eps = epsilon[det];
        const double eta = (1.0 - eps) / (1.0 + eps);
        toast_compact_weights(boresight, pflags, use_pflags, pmask, hwp, use_hwp, s, fp, eta,
                              cal[det], gamma[det], iau ? -1.0 : 1.0, w);
        return (i64)compact[(i64)pixel_index[det] * n_samp + s];
    }
    const i64 wo = 3 * ((i64)weight_index[det] * n_samp + s);
    w[0] = weights[wo];
    w[1] = weights[wo + 1];
    w[2] = weights[wo + 2];
    return pixels[(i64)pixel_index[det] * n_samp + s];
}

/* compact_expand_pointing: pixels widened, weights rebuilt (nnz 3) or cal;
 * the outputs' rows hold out_n_samp samples from sample out_first. */
KERNEL void toast_compact_expand_pointing(
    TOAST_GRID_ARGS, i64 n_samp, GLOBAL const i64 *RESTRICT intervals, i64 nnz, i64 out_first,
    i64 out_n_samp,
    GLOBAL const i32 *RESTRICT compact_index, GLOBAL const i32 *RESTRICT pixel_index,
    GLOBAL const i32 *RESTRICT weight_index, GLOBAL const double *RESTRICT focalplane,
    GLOBAL const double *RESTRICT epsilon, GLOBAL const double *RESTRICT gamma,
    GLOBAL const double *RESTRICT cal, GLOBAL const i32 *RESTRICT compact,
    GLOBAL const double *RESTRICT boresight, GLOBAL const u8 *RESTRICT pflags, i32 use_pflags,
    i32 pmask, GLOBAL const double *RESTRICT hwp, i32 use_hwp, i32 iau,
    GLOBAL i64 *RESTRICT pixels, GLOBAL double *RESTRICT weights) {
    TOAST_SAMPLE_GRID(intervals)
    const i64 o = s - out_first;
    pixels[(i64)pixel_index[det] * out_n_samp + o] = (i64)compact[(i64)compact_index[det] * n_samp + s];
    const i64 wo = nnz * ((i64)weight_index[det] * out_n_samp + o);
    if (nnz == 1) {
        weights[wo] = cal[det];
        return;
    }
    double fp[4];
    fp[0] = focalplane[4 * det];
    fp[1] = focalplane[4 * det + 1];
    fp[2] = focalplane[4 * det + 2];
    fp[3] = focalplane[4 * det + 3];
    const double eps = epsilon[det];
    const double eta = (1.0 - eps) / (1.0 + eps);
    double w[3];
    toast_compact_weights(boresight, pflags, use_pflags, pmask, hwp, use_hwp, s, fp, eta,
                          cal[det], gamma[det], iau ? -1.0 : 1.0, w);
    weights[wo] = w[0];
    weights[wo + 1] = w[1];
    weights[wo + 2] = w[2];
}

/* fused_accumulate: zmap += (t * det_scale) * w, t the signal (use_data) or
 * F a (0 + a under an unflagged amplitude, 0 under a flagged one, 0 without
 * amplitudes: amp_offset -1).  finite[det] with a finite det_scale: a value
 * of +-0 adds +-0, left out (F a: before the pixel is read, as the CPU). */
KERNEL void toast_fused_accumulate(
    TOAST_GRID_ARGS, i64 n_samp, GLOBAL const i64 *RESTRICT intervals, i32 compact_form,
    GLOBAL const i32 *RESTRICT pixel_index, GLOBAL const i32 *RESTRICT weight_index,
    GLOBAL const double *RESTRICT focalplane, GLOBAL const double *RESTRICT epsilon,
    GLOBAL const double *RESTRICT gamma, GLOBAL const double *RESTRICT cal,
    GLOBAL const i32 *RESTRICT data_index, GLOBAL const i32 *RESTRICT flag_index,
    GLOBAL const double *RESTRICT det_scale, i64 step_length,
    GLOBAL const i64 *RESTRICT amp_offset, GLOBAL const i64 *RESTRICT view_offset,
    GLOBAL const i64 *RESTRICT g2l, i64 n_global_submap, i64 n_pix_submap,
    GLOBAL const i32 *RESTRICT compact, GLOBAL const double *RESTRICT boresight,
    GLOBAL const u8 *RESTRICT pflags, i32 use_pflags, i32 pmask, GLOBAL const double *RESTRICT hwp,
    i32 use_hwp, i32 iau, GLOBAL const i64 *RESTRICT pixels, GLOBAL const double *RESTRICT weights,
    GLOBAL const double *RESTRICT det_data, i32 use_data, GLOBAL const u8 *RESTRICT det_flags,
    i32 use_det_flags, i32 det_mask, GLOBAL const u8 *RESTRICT finite,
    GLOBAL const u8 *RESTRICT shared_flags, i32 use_shared_flags, i32 shared_mask,
    GLOBAL const double *RESTRICT amplitudes,
    GLOBAL const u8 *RESTRICT amplitude_flags, GLOBAL double *RESTRICT zmap,
    GLOBAL u64 *RESTRICT err) {
    TOAST_SAMPLE_GRID(intervals)
    if (use_det_flags) {
        const i32 fi = flag_index[det];
        if (fi >= 0 && (det_flags[(i64)fi * n_samp + s] & det_mask) != 0) {
            return;
        }
    }
    if (use_shared_flags && (shared_flags[s] & shared_mask) != 0) {
        return;
    }
    const double scale = det_scale[det];
    const int skips = finite[det] != 0 && scale - scale == 0.0;
    double x = 0.0;
    if (!use_data) {
        const i64 a0 = amp_offset[det];
        if (a0 >= 0) {
            const i64 amp = a0 + view_offset[iv] + (s - first) / step_length;
            if (amplitude_flags[amp] == 0) {
                x = 0.0 + amplitudes[amp];
            }
        }
        if (x == 0.0 && skips) {
            return;
        }
    }
    double w[3];
    const i64 p = toast_fused_pointing(det, s, n_samp, compact_form, pixel_index, weight_index,
                                       focalplane, epsilon, gamma, cal, compact, boresight, pflags,
                                       use_pflags, pmask, hwp, use_hwp, iau, pixels, weights, w);
    if (p < 0) {
        return;
    }
    i64 l = 0;
    i64 sub = 0;
    if (!toast_locate(g2l, n_global_submap, n_pix_submap, p, &l, &sub)) {
        atomic_min_u64(err, TOAST_ERR_KEY(det, s));
        return;
    }
    if (use_data) {
        x = det_data[(i64)data_index[det] * n_samp + s];
        if (x == 0.0 && skips) {
            return;
        }
    }
    const i64 zo = 3 * (l * n_pix_submap + sub);
    const double scaled = x * scale;
    for (i64 i = 0; i < 3; i++) {
        atomic_add_f64(&zmap[zo + i], scaled * w[i]);
    }
}

/* fused_project: one block (of TOAST_PROJECT_THREADS threads) per amplitude,
 * as template_offset_project_signal: block GRP0 the amplitude inside the
 * view, GRP1 the interval, GRP2 the detector.  out += the sum of
 * (t - sum_k w_k m_k) * det_scale over the amplitude's samples whose flags
 * are clear: thread t sums samples s0 + t, s0 + t + LSIZE0, ... in that
 * order, and the threads' sums are added by the same fixed-shape tree
 * (deterministic for a block size; the CPU's sample order only up to
 * rounding, the conformance runner's tolerant mode).  An amplitude is often
 * a whole observation (the default baseline is longer than one), so one
 * thread per amplitude would walk hundreds of thousands of samples, each a
 * rebuilt pointing and dependent loads, while the rest of the device idles.
 * A pixel outside the local map records its key and stops that thread's
 * sum; every thread reaches the barriers. */
KERNEL void toast_fused_project(
    TOAST_GRID_ARGS, i64 n_samp, GLOBAL const i64 *RESTRICT intervals, i32 compact_form,
    GLOBAL const i32 *RESTRICT pixel_index, GLOBAL const i32 *RESTRICT weight_index,
    GLOBAL const double *RESTRICT focalplane, GLOBAL const double *RESTRICT epsilon,
    GLOBAL const double *RESTRICT gamma, GLOBAL const double *RESTRICT cal,
    GLOBAL const i32 *RESTRICT data_index, GLOBAL const i32 *RESTRICT flag_index,
    GLOBAL const double *RESTRICT det_scale, i64 step_length,
    GLOBAL const i64 *RESTRICT amp_offset, GLOBAL const i64 *RESTRICT view_offset,
    GLOBAL const i64 *RESTRICT g2l, i64 n_global_submap, i64 n_pix_submap,
    GLOBAL const i32 *RESTRICT compact, GLOBAL const double *RESTRICT boresight,
    GLOBAL const u8 *RESTRICT pflags, i32 use_pflags, i32 pmask, GLOBAL const double *RESTRICT hwp,
    i32 use_hwp, i32 iau, GLOBAL const i64 *RESTRICT pixels, GLOBAL const double *RESTRICT weights,
    GLOBAL const double *RESTRICT det_data, i32 use_data, GLOBAL const u8 *RESTRICT det_flags,
    i32 use_det_flags, i32 det_mask, GLOBAL const double *RESTRICT mapdata,
    GLOBAL const double *RESTRICT amplitudes, GLOBAL const u8 *RESTRICT amplitude_flags,
    GLOBAL double *RESTRICT amplitudes_out, GLOBAL u64 *RESTRICT err) {
    TOAST_AMP_BLOCK
    double acc = 0.0;
    if (active) {
        const double x = use_data ? 0.0 : 0.0 + amplitudes[amp];
        const double scale = det_scale[det];
        const i32 fi = use_det_flags ? flag_index[det] : -1;
        for (i64 s = s0 + t; s < s1; s += nt) {
            double v = use_data ? det_data[(i64)data_index[det] * n_samp + s] : x;
            double w[3];
            const i64 p = toast_fused_pointing(det, s, n_samp, compact_form, pixel_index,
                                               weight_index, focalplane, epsilon, gamma, cal,
                                               compact, boresight, pflags, use_pflags, pmask, hwp,
                                               use_hwp, iau, pixels, weights, w);
            if (p >= 0) {
                i64 l = 0;
                i64 sub = 0;
                if (!toast_locate(g2l, n_global_submap, n_pix_submap, p, &l, &sub)) {
                    atomic_min_u64(err, TOAST_ERR_KEY(det, s));
                    break;
                }
                const i64 mo = 3 * (l * n_pix_submap + sub);
                double val = 0.0;
                for (i64 i = 0; i < 3; i++) {
                    val += w[i] * mapdata[mo + i];
                }
                v -= val;
            }
            v *= scale;
            const int good = fi < 0 || (det_flags[(i64)fi * n_samp + s] & det_mask) == 0;
            acc += good ? v : 0.0;
        }
    }
    red[t] = acc;
    BLOCK_BARRIER();
    toast_block_sum_rows(red, 1);
    if (active && t == 0) {
        amplitudes_out[amp] += red[0];
    }
}

/* ---- noise simulation: sim_noise (ABI minor 5) --------------------------
 * TOAST's tod_sim_noise_timestream per detector, added to its row of
 * det_data, in six launches over a batch of detectors (grid dimension 1 the
 * detector of the batch, d0 + GID1; dimension 0 the index inside its
 * stream).  Each detector of the batch has a slice of the global workspace
 * `work` of item_step >= 2 N + 2 doubles: region R0 = work[0, N) and
 * R1 = work[N, 2 N + 2), N = fft_len, M = N / 2.
 *
 *  0. toast_sim_noise_twiddles (j in [0, M)), once per call: the table
 *     tw[j] = e^{2 pi i j / N} from toast_cos and toast_sin (correctly
 *     rounded: the same bits on every target), in its own buffer.
 *  1. toast_sim_noise_spectrum (k in [0, M]): the half-complex spectrum
 *     X_k into R1, (re, im) pairs.  Deviate j is TOAST's: Threefry-2x64-20
 *     at key (keys[2d], keys[2d+1]), counter (0, counter0 + j), word 0;
 *     Random123's u01; sqrt(2) erfinv(2u - 1) with Giles' erfinv, in the
 *     CPU's operations (toast_accel::math::rng); counter0 passes as the
 *     bits of an i64 (the launchers pass no u64).  X_0 = A_0 g_0 (TOAST's
 *     A_0 = 0), X_k = A_k (g_k + i g_{N-k}), X_M = A_M g_M.
 *  2. toast_sim_noise_pack (k in [0, M)): the inverse real FFT of length N as
 *     a complex one of length M: Z_k = (X_k + conj X_{M-k})
 *     + i (X_k - conj X_{M-k}) e^{2 pi i k / N} into R0, so that the complex
 *     inverse FFT z of Z holds x_{2m} + i x_{2m+1}: the real output in order.
 *  3. toast_sim_noise_fft_stage (t in [0, M/2)), log2 M launches: a radix-2
 *     Stockham stage (autosort: no bit reversal) of the inverse complex FFT,
 *     sub-transform length n = M, M/2, ..., 2 with stride s = M / n
 *     (m_len = M: `half` is a type in OpenCL C), from one region to the
 *     other; twiddle e^{2 pi i p s / M} = tw[2 p s].
 *  4. toast_sim_noise_partial (c in [0, ceil(n_samp / chunk))): the sum of
 *     chunk scaled samples x_{off + i} / N, off = (N - n_samp) / 2, in sample
 *     order, into the region the FFT did not end in.
 *  5. toast_sim_noise_mean (one thread per detector): the mean of the kept
 *     samples from the chunk sums, in chunk order.
 *  6. toast_sim_noise_add (i in [0, n_samp)):
 *     det_data[row, i] += x_{off + i} / N - mean.
 * The deviates and the spectrum are the CPU's bits; the FFT and the mean
 * round differently from realfft's and from a sum in sample order (about
 * 1e-15 of the noise RMS; conformance: NOISE_RTOL). */

#define TOAST_TWO_PI 6.283185307179586476925286766559

/* Threefry-2x64-20, word 0 (Random123's threefry2x64 with 20 rounds). */
DEVICE_FN u64 toast_rotl64(u64 x, int r) { return (x << r) | (x >> (64 - r)); }

DEVICE_FN u64 toast_threefry2x64_w0(u64 c0, u64 c1, u64 k0, u64 k1) {
    const int rot[8] = {16, 42, 12, 31, 16, 32, 24, 21};
    u64 ks[3];
    ks[0] = k0;
    ks[1] = k1;
    ks[2] = 0x1BD11BDAA9FC1A22UL ^ k0 ^ k1;
    u64 x0 = c0 + ks[0];
    u64 x1 = c1 + ks[1];
    for (int r = 0; r < 20; r++) {
        x0 += x1;
        x1 = toast_rotl64(x1, rot[r % 8]);
        x1 ^= x0;
        if (r % 4 == 3) {
            const int s = (r + 1) / 4;
            x0 += ks[s % 3];
            x1 += ks[(s + 1) % 3] + (u64)s;
        }
    }
    return x0;
}

/* Giles' double-precision erfinv for |x| < 1, the CPU's operations. */
DEVICE_FN double toast_erfinv(double x) {
    const double ab = fabs(x);
    if (ab >= 1.0) {
        return copysign(TOAST_INF_F64, x); /* +-inf at +-1, as the CPU's erfinv */
    }
    const double w = -log((1.0 - ab) * (1.0 + ab));
    double p;
    if (w < 6.25) {
        const double t = w - 3.125;
        p = -3.6444120640178197e-21;
        p = p * t + -1.6850591381820166e-19;
        p = p * t + 1.2858480715256400e-18;
        p = p * t + 1.1157877678025181e-17;
        p = p * t + -1.3331716628546209e-16;
        p = p * t + 2.0972767875968562e-17;
        p = p * t + 6.6376381343583238e-15;
        p = p * t + -4.0545662729752069e-14;
        p = p * t + -8.1519341976054722e-14;
        p = p * t + 2.6335093153082323e-12;
        p = p * t + -1.2975133253453532e-11;
        p = p * t + -5.415412054294628e-11;
        p = p * t + 1.0512122733215323e-9;
        p = p * t + -4.1126339803469837e-9;
        p = p * t + -2.9070369957882005e-8;
        p = p * t + 4.2347877827932404e-7;
        p = p * t + -1.3654692000834679e-6;
        p = p * t + -1.3882523362786469e-5;
        p = p * t + 1.8673420803405714e-4;
        p = p * t + -7.4070253416626698e-4;
        p = p * t + -6.033670871430149e-3;
        p = p * t + 0.2401581824255896;
        p = p * t + 1.6536545626831027;
    } else if (w < 16.0) {
        const double t = sqrt(w) - 3.25;
        p = 2.2137376921775787e-9;
        p = p * t + 9.075656193888539e-8;
        p = p * t + -2.7517406297064545e-7;
        p = p * t + 1.8239629214389228e-8;
        p = p * t + 1.5027403968909828e-6;
        p = p * t + -4.013867526981546e-6;
        p = p * t + 2.9234449089955446e-6;
        p = p * t + 1.2475304481671779e-5;
        p = p * t + -4.7318229009055734e-5;
        p = p * t + 6.8284851459573175e-5;
        p = p * t + 2.4031110387097894e-5;
        p = p * t + -3.5503752036284748e-4;
        p = p * t + 9.532893797373805e-4;
        p = p * t + -1.6882755560235047e-3;
        p = p * t + 2.491442096107851e-3;
        p = p * t + -3.7512085075692412e-3;
        p = p * t + 5.3709145535900636e-3;
        p = p * t + 1.0052589676941592;
        p = p * t + 3.0838856104922208;
    } else {
        const double t = sqrt(w) - 5.0;
        p = -2.7109920616438573e-11;
        p = p * t + -2.5556418169965252e-10;
        p = p * t + 1.5076572693500548e-9;
        p = p * t + -3.789465440126737e-9;
        p = p * t + 7.6157012080783394e-9;
        p = p * t + -1.496002662714924e-8;
        p = p * t + 2.914795345090108e-8;
        p = p * t + -6.771199775845234e-8;
        p = p * t + 2.2900482228026655e-7;
        p = p * t + -9.9298272942317e-7;
        p = p * t + 4.5260625972231537e-6;
        p = p * t + -1.968177810553167e-5;
        p = p * t + 7.599527703001776e-5;
        p = p * t + -2.1503011930044477e-4;
        p = p * t + -1.3871931833623122e-4;
        p = p * t + 1.0103004648645344;
        p = p * t + 4.8499064014085844;
    }
    return p * x;
}

/* Deviate j of a stream: sqrt(2) erfinv(2 u01(w) - 1). */
DEVICE_FN double toast_noise_deviate(u64 k0, u64 k1, u64 counter0, i64 j) {
    const u64 w = toast_threefry2x64_w0(0, counter0 + (u64)j, k0, k1);
    const double factor = 5.421010862427522170037264004349708557128906e-20; /* 2^-64 */
    const double u = (double)w * factor + 0.5 * factor;
    const double x = 2.0 * u - 1.0;
    return 1.4142135623730951 * toast_erfinv(x);
}

/* The twiddle table of a call: tw[j] = e^{2 pi i j / N}, j in [0, N/2),
 * (re, im) pairs, from toast_cos and toast_sin (correctly rounded), made
 * once per call and read by the pack and every FFT stage. */
KERNEL void toast_sim_noise_twiddles(i64 fft_len, GLOBAL double *RESTRICT tw) {
    const i64 j = GID0;
    if (j >= fft_len / 2) {
        return;
    }
    const double ang = (double)j * (TOAST_TWO_PI / (double)fft_len);
    tw[2 * j] = toast_cos(ang);
    tw[2 * j + 1] = toast_sin(ang);
}

KERNEL void toast_sim_noise_spectrum(i64 d0, i64 d_end, i64 fft_len, i64 counter0, i64 n_amp,
                                     GLOBAL const u64 *RESTRICT keys,
                                     GLOBAL const i32 *RESTRICT filter_index,
                                     GLOBAL const double *RESTRICT amplitudes,
                                     GLOBAL double *RESTRICT work, i64 item_step) {
    const i64 d = d0 + GID1;
    const i64 k = GID0;
    const i64 m = fft_len / 2;
    if (d >= d_end || k > m) {
        return;
    }
    const u64 k0 = keys[2 * d];
    const u64 k1 = keys[2 * d + 1];
    const double a = amplitudes[(i64)filter_index[d] * n_amp + k];
    GLOBAL double *x = work + GID1 * item_step + fft_len;
    const double re = toast_noise_deviate(k0, k1, (u64)counter0, k) * a;
    double im = 0.0;
    if (k > 0 && k < m) {
        im = toast_noise_deviate(k0, k1, (u64)counter0, fft_len - k) * a;
    }
    x[2 * k] = re;
    x[2 * k + 1] = im;
}

KERNEL void toast_sim_noise_pack(i64 d0, i64 d_end, i64 fft_len,
                                 GLOBAL const double *RESTRICT tw,
                                 GLOBAL double *RESTRICT work, i64 item_step) {
    const i64 d = d0 + GID1;
    const i64 k = GID0;
    const i64 m = fft_len / 2;
    if (d >= d_end || k >= m) {
        return;
    }
    GLOBAL double *z = work + GID1 * item_step;
    GLOBAL const double *x = z + fft_len;
    const double ar = x[2 * k];
    const double ai = x[2 * k + 1];
    const double br = x[2 * (m - k)];
    const double bi = -x[2 * (m - k) + 1];
    const double er = ar + br;
    const double ei = ai + bi;
    const double dr = ar - br;
    const double di = ai - bi;
    const double c = tw[2 * k];
    const double s = tw[2 * k + 1];
    const double or_ = dr * c - di * s;
    const double oi = dr * s + di * c;
    z[2 * k] = er - oi;
    z[2 * k + 1] = ei + or_;
}

KERNEL void toast_sim_noise_fft_stage(i64 d0, i64 d_end, i64 m_len, i64 n, i64 src_off,
                                      i64 dst_off, GLOBAL const double *RESTRICT tw,
                                      GLOBAL double *RESTRICT work, i64 item_step) {
    const i64 d = d0 + GID1;
    const i64 t = GID0;
    if (d >= d_end || t >= m_len / 2) {
        return;
    }
    const i64 s = m_len / n;
    const i64 q = t % s;
    const i64 p = t / s;
    const i64 h = n / 2;
    GLOBAL double *base = work + GID1 * item_step;
    GLOBAL const double *src = base + src_off;
    GLOBAL double *dst = base + dst_off;
    const i64 ia = q + s * p;
    const i64 ib = q + s * (p + h);
    const double ar = src[2 * ia];
    const double ai = src[2 * ia + 1];
    const double br = src[2 * ib];
    const double bi = src[2 * ib + 1];
    /* e^{2 pi i p s / M} = tw[2 p s] (2 p s < M). */
    const double c = tw[4 * p * s];
    const double sn = tw[4 * p * s + 1];
    const double dr = ar - br;
    const double di = ai - bi;
    const i64 o0 = q + s * (2 * p);
    const i64 o1 = o0 + s;
    dst[2 * o0] = ar + br;
    dst[2 * o0 + 1] = ai + bi;
    dst[2 * o1] = dr * c - di * sn;
    dst[2 * o1 + 1] = dr * sn + di * c;
}

KERNEL void toast_sim_noise_partial(i64 d0, i64 d_end, i64 fft_len, i64 n_samp, i64 chunk,
                                    i64 res_off, i64 sum_off, GLOBAL double *RESTRICT work,
                                    i64 item_step) {
    const i64 d = d0 + GID1;
    const i64 c = GID0;
    const i64 n_chunk = (n_samp + chunk - 1) / chunk;
    if (d >= d_end || c >= n_chunk) {
        return;
    }
    GLOBAL double *base = work + GID1 * item_step;
    GLOBAL const double *x = base + res_off + (fft_len - n_samp) / 2;
    const double scale = 1.0 / (double)fft_len;
    i64 hi = (c + 1) * chunk;
    if (hi > n_samp) {
        hi = n_samp;
    }
    double acc = 0.0;
    for (i64 i = c * chunk; i < hi; i++) {
        acc += x[i] * scale;
    }
    base[sum_off + c] = acc;
}

KERNEL void toast_sim_noise_mean(i64 d0, i64 d_end, i64 n_samp, i64 chunk, i64 sum_off,
                                 GLOBAL double *RESTRICT work, i64 item_step) {
    const i64 d = d0 + GID1;
    if (d >= d_end || GID0 != 0) {
        return;
    }
    GLOBAL double *sums = work + GID1 * item_step + sum_off;
    const i64 n_chunk = (n_samp + chunk - 1) / chunk;
    double acc = 0.0;
    for (i64 c = 0; c < n_chunk; c++) {
        acc += sums[c];
    }
    sums[n_chunk] = acc / (double)n_samp;
}

KERNEL void toast_sim_noise_add(i64 d0, i64 d_end, i64 fft_len, i64 n_samp, i64 chunk,
                                i64 res_off, i64 sum_off, GLOBAL const i32 *RESTRICT data_index,
                                GLOBAL const double *RESTRICT work, i64 item_step,
                                GLOBAL double *RESTRICT det_data) {
    const i64 d = d0 + GID1;
    const i64 i = GID0;
    if (d >= d_end || i >= n_samp) {
        return;
    }
    GLOBAL const double *base = work + GID1 * item_step;
    const double scale = 1.0 / (double)fft_len;
    const double mean = base[sum_off + (n_samp + chunk - 1) / chunk];
    const double v = base[res_off + (fft_len - n_samp) / 2 + i] * scale;
    det_data[(i64)data_index[d] * n_samp + i] += v - mean;
}

/* ---- cov_accum_timestream (ABI minor 5; atomic accumulation) ----------- */

/* The hit map and the packed inverse covariance from the timestream's
 * pointing (TOAST's BuildHitMap and BuildInverseCovariance): one thread per
 * (detector, interval, sample) on the per-sample grid; a sample its flags
 * keep with a pixel >= 0 adds one hit (use_hits) and
 * w[k] * (w[j] * det_scale) to each packed element (j, k), j <= k
 * (use_invnpp; TOAST's cov_accum_diag_invnpp operations).  Hits are integer
 * atomics (exact in any order); the covariance's summation order is the
 * atomics'.  A pixel outside the local submaps records its key in err. */
KERNEL void toast_cov_accum_timestream(
    TOAST_GRID_ARGS, i64 n_samp, GLOBAL const i64 *RESTRICT intervals, i64 nnz,
    GLOBAL const i32 *RESTRICT pixel_index, GLOBAL const i32 *RESTRICT weight_index,
    GLOBAL const i32 *RESTRICT flag_index, GLOBAL const double *RESTRICT det_scale,
    GLOBAL const i64 *RESTRICT g2l, i64 n_global_submap, i64 n_pix_submap,
    GLOBAL const i64 *RESTRICT pixels, GLOBAL const double *RESTRICT weights,
    GLOBAL const u8 *RESTRICT det_flags, i32 use_det_flags, i32 det_mask,
    GLOBAL const u8 *RESTRICT shared_flags, i32 use_shared_flags, i32 shared_mask,
    GLOBAL i64 *RESTRICT hits, i32 use_hits, GLOBAL double *RESTRICT invnpp, i32 use_invnpp,
    GLOBAL u64 *RESTRICT err) {
    TOAST_SAMPLE_GRID(intervals)
    i64 px = 0;
    if (!toast_accum_pixel(det, s, n_samp, pixel_index, flag_index, g2l, n_global_submap,
                           n_pix_submap, pixels, det_flags, use_det_flags, det_mask, shared_flags,
                           use_shared_flags, shared_mask, err, &px)) {
        return;
    }
    if (use_hits) {
        atomic_add_i64(&hits[px], 1);
    }
    if (use_invnpp) {
        const i64 wo = nnz * ((i64)weight_index[det] * n_samp + s);
        const double scale = det_scale[det];
        i64 c = px * (nnz * (nnz + 1) / 2);
        for (i64 j = 0; j < nnz; j++) {
            const double scaled_weight = weights[wo + j] * scale;
            for (i64 k = j; k < nnz; k++) {
                atomic_add_f64(&invnpp[c], weights[wo + k] * scaled_weight);
                c++;
            }
        }
    }
}

/* ---- solver_flags (ABI minor 6; integer work) ---------------------------- */

/* The destriping solver's sample flags (TOAST's SolveAmplitudes solver
 * flags and ScanMask), OR-ed into flags.  Two launches on one stream:
 * toast_solver_flags_gaps ORs cut_bit into the samples outside every
 * interval (the host hands it those ranges, `gaps`, on the per-sample
 * grid); toast_solver_flags walks the intervals, each thread `chunk`
 * samples strided by the grid's width `stride` (consecutive threads read
 * consecutive samples), and adds its cut and total samples to counts with
 * one integer atomic each (exact in any order).  Overlapping intervals may
 * OR the same byte from two threads: both store the same value.  A pixel
 * beyond the map records its key in err; a pixel in a submap that is not
 * local adds nothing (TOAST's ScanMask reads no such pixel). */
KERNEL void toast_solver_flags_gaps(TOAST_GRID_ARGS, i64 n_samp, GLOBAL const i64 *RESTRICT gaps,
                                    GLOBAL const i32 *RESTRICT out_index,
                                    GLOBAL u8 *RESTRICT flags, i32 cut_bit) {
    TOAST_SAMPLE_GRID(gaps)
    const i64 o = (i64)out_index[det] * n_samp + s;
    flags[o] = (u8)(flags[o] | cut_bit);
}

KERNEL void toast_solver_flags(
    TOAST_GRID_ARGS, i64 n_samp, GLOBAL const i64 *RESTRICT intervals, i64 chunk, i64 stride,
    GLOBAL const i32 *RESTRICT flag_index, GLOBAL const i32 *RESTRICT pixel_index,
    GLOBAL const i32 *RESTRICT out_index, GLOBAL const i64 *RESTRICT g2l, i64 n_global_submap,
    i64 n_pix_submap, GLOBAL const u8 *RESTRICT det_flags, i32 use_det_flags, i32 det_mask,
    GLOBAL const u8 *RESTRICT shared_flags, i32 use_shared_flags, i32 shared_mask,
    GLOBAL const i64 *RESTRICT pixels, GLOBAL const u8 *RESTRICT pixel_mask, i32 use_mask,
    GLOBAL u8 *RESTRICT flags, GLOBAL i64 *RESTRICT counts, i32 cut_bit, i32 mask_bit,
    GLOBAL u64 *RESTRICT err) {
    const i64 det = det0 + GID2;
    const i64 iv = iv0 + GID1;
    /* The grid may be rounded up past its width: those threads would
     * repeat other threads' samples. */
    if (det >= det_end || iv >= iv_end || GID0 >= stride) {
        return;
    }
    const i64 first = intervals[2 * iv];
    const i64 last = intervals[2 * iv + 1];
    const i64 fo = use_det_flags ? (i64)flag_index[det] * n_samp : 0;
    const i64 po = use_mask ? (i64)pixel_index[det] * n_samp : 0;
    const i64 oo = (i64)out_index[det] * n_samp;
    i64 cut = 0;
    i64 total = 0;
    for (i64 k = 0; k < chunk; k++) {
        const i64 s = first + GID0 + k * stride;
        if (s >= last) {
            break;
        }
        i32 v = 0;
        if ((use_det_flags && (det_flags[fo + s] & det_mask) != 0) ||
            (use_shared_flags && (shared_flags[s] & shared_mask) != 0)) {
            v |= cut_bit;
        }
        if (use_mask) {
            const i64 p = pixels[po + s];
            if (p >= 0) {
                const i64 sm = p / n_pix_submap;
                if (sm >= n_global_submap) {
                    atomic_min_u64(err, TOAST_ERR_KEY(det, s));
                    break;
                }
                const i64 ls = g2l[sm];
                if (ls >= 0 && pixel_mask[ls * n_pix_submap + p % n_pix_submap] != 0) {
                    v |= mask_bit;
                }
            }
        }
        const u8 f = (u8)(flags[oo + s] | v);
        flags[oo + s] = f;
        cut += (f != 0) ? 1 : 0;
        total += 1;
    }
    if (total > 0) {
        atomic_add_i64(&counts[0], cut);
        atomic_add_i64(&counts[1], total);
    }
}
