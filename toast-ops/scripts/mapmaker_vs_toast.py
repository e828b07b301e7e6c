#!/usr/bin/env python3
"""Run TOAST 3.0.6's MapMaker on inputs exported by toast-ops' test
`toast_reference::export_inputs_for_toast` and write its products.

Usage: mapmaker_vs_toast.py INPUT_DIR OUTPUT_DIR

The configuration mirrors the Rust test: PointingDetectorSimple,
PixelsHealpix (NESTED), StokesWeights (IQU), BinMap (pixel_dist "pix_dist"),
an Offset template ("baselines") with the given step_time and no noise
model, MapMaker with the given rcond thresholds and default convergence.
Noise weights are passed to TOAST's Noise as `detweights`.

Outputs (raw little-endian): hits.bin (i64, full sky), rcond.bin, cov.bin
(f64, full sky x 6), binmap.bin and map.bin (f64, full sky x 3),
amplitudes.bin (f64), and info.json (amplitude counts, solver cut, CG
iterations and relative residuals parsed from TOAST's log).
"""

import json
import os
import re
import sys
import tempfile

os.environ["TOAST_LOGLEVEL"] = "INFO"

import numpy as np
from astropy import units as u
from astropy.table import Column, QTable

import toast
import toast.ops
import toast.templates
from toast.instrument import Focalplane, SpaceSite, Telescope
from toast.noise import Noise


def main():
    src, dst = sys.argv[1], sys.argv[2]
    os.makedirs(dst, exist_ok=True)
    man = json.load(open(os.path.join(src, "manifest.json")))
    dets = man["detectors"]
    ndet = len(dets)
    nsamp = man["n_samples"]
    rate = man["rate"]

    def load(name, dtype, shape):
        return np.fromfile(os.path.join(src, f"{name}.bin"), dtype=dtype).reshape(shape)

    quats = load("fp_quats", np.float64, (ndet, 4))
    weights = load("fp_weights", np.float64, (ndet,))
    table = QTable(
        [
            Column(name="name", data=dets),
            Column(name="quat", data=quats),
            Column(name="pol_leakage", data=np.zeros(ndet)),
            Column(name="psi_pol", data=np.zeros(ndet), unit=u.rad),
            Column(name="gamma", data=np.zeros(ndet), unit=u.rad),
            Column(name="fwhm", data=np.ones(ndet), unit=u.arcmin),
            Column(name="psd_fmin", data=np.full(ndet, 1e-5), unit=u.Hz),
            Column(name="psd_fknee", data=np.full(ndet, 1e-3), unit=u.Hz),
            Column(name="psd_alpha", data=np.ones(ndet)),
            Column(name="psd_net", data=1.0 / np.sqrt(weights * rate), unit=u.K * u.s**0.5),
        ]
    )
    fp = Focalplane(detector_data=table, sample_rate=rate * u.Hz)
    tele = Telescope("sat", focalplane=fp, site=SpaceSite("space"))
    comm = toast.Comm(world=None)
    data = toast.Data(comm)
    for name in man["observations"]:
        ob = toast.Observation(comm, tele, n_samples=nsamp, name=name)
        for key, dtype, shape, f in [
            ("times", np.float64, (nsamp,), "times"),
            ("boresight_radec", np.float64, (nsamp, 4), "boresight"),
            ("flags", np.uint8, (nsamp,), "shared_flags"),
        ]:
            ob.shared.create_column(key, shape=shape, dtype=dtype)
            ob.shared[key].set(load(f"{name}_{f}", dtype, shape), offset=(0,) * len(shape), fromrank=0)
        ob.detdata.create("signal", dtype=np.float64, units=u.K)
        ob.detdata["signal"][:] = load(f"{name}_signal", np.float64, (ndet, nsamp))
        ob.detdata.create("flags", dtype=np.uint8)
        ob.detdata["flags"][:] = load(f"{name}_det_flags", np.uint8, (ndet, nsamp))
        freqs = {d: np.array([0.0, rate / 2]) * u.Hz for d in dets}
        psds = {d: np.ones(2) * u.K**2 * u.s for d in dets}
        detw = {d: w * (1.0 / u.K**2) for d, w in zip(dets, weights)}
        ob["noise_model"] = Noise(detectors=dets, freqs=freqs, psds=psds, detweights=detw)
        data.obs.append(ob)

    det_pointing = toast.ops.PointingDetectorSimple(name="det_pointing")
    pixels = toast.ops.PixelsHealpix(
        name="pixels",
        nside=man["nside"],
        nside_submap=man["nside_submap"],
        nest=True,
        detector_pointing=det_pointing,
    )
    weights_op = toast.ops.StokesWeights(name="weights", mode="IQU", detector_pointing=det_pointing)
    binner = toast.ops.BinMap(
        name="binner",
        pixel_dist="pix_dist",
        pixel_pointing=pixels,
        stokes_weights=weights_op,
        noise_model="noise_model",
    )
    baselines = toast.templates.Offset(name="baselines", step_time=man["step_time"] * u.second)
    tmatrix = toast.ops.TemplateMatrix(templates=[baselines])
    mapmaker = toast.ops.MapMaker(
        name="mapmaker",
        binning=binner,
        template_matrix=tmatrix,
        solve_rcond_threshold=man["rcond"],
        map_rcond_threshold=man["rcond"],
        write_map=False,
        write_binmap=True,
        write_hits=False,
        write_cov=False,
        write_rcond=False,
        keep_final_products=True,
        keep_solver_products=True,
        output_dir=dst,
    )
    # TOAST's logger is C++: capture file descriptor 1 to read the CG log.
    log = tempfile.TemporaryFile(mode="w+b")
    saved = os.dup(1)
    os.environ["TOAST_LOGLEVEL"] = "INFO"
    sys.stdout.flush()
    os.dup2(log.fileno(), 1)
    try:
        mapmaker.apply(data)
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
    log.seek(0)
    text = log.read().decode(errors="replace")
    sys.stdout.write(text)

    def full(key, nval, dtype):
        pd = data[key]
        dist = pd.distribution
        out = np.zeros((dist.n_submap * dist.n_pix_submap, nval), dtype=dtype)
        for loc, sm in enumerate(dist.local_submaps):
            out[sm * dist.n_pix_submap : (sm + 1) * dist.n_pix_submap] = pd.data[loc].reshape(-1, nval)
        return out[: dist.n_pix]

    full("mapmaker_hits", 1, np.int64).tofile(os.path.join(dst, "hits.bin"))
    full("mapmaker_rcond", 1, np.float64).tofile(os.path.join(dst, "rcond.bin"))
    full("mapmaker_cov", 6, np.float64).tofile(os.path.join(dst, "cov.bin"))
    full("mapmaker_binmap", 3, np.float64).tofile(os.path.join(dst, "binmap.bin"))
    full("mapmaker_map", 3, np.float64).tofile(os.path.join(dst, "map.bin"))
    amps = data["mapmaker_solve_amplitudes"]["baselines"]
    np.asarray(amps.local, dtype=np.float64).tofile(os.path.join(dst, "amplitudes.bin"))
    its = [int(m) for m in re.findall(r"MapMaker iteration\s+(\d+), relative residual", text)]
    rel = [float(m) for m in re.findall(r"relative residual = ([0-9.eE+-]+)", text)]
    cut = re.search(r"Solver flags cut (\d+) / (\d+)", text)
    info = {
        "toast_version": toast.__version__,
        "n_amplitudes": int(amps.n_global),
        "n_flagged": int(np.count_nonzero(amps.local_flags)),
        "solver_cut": int(cut.group(1)) if cut else -1,
        "solver_total": int(cut.group(2)) if cut else -1,
        "iterations": (its[-1] + 1) if its else 0,
        "relative_residuals": rel,
    }
    json.dump(info, open(os.path.join(dst, "info.json"), "w"), indent=1)
    # write_binmap=True is needed for TOAST to make the binned map; drop its file.
    for f in os.listdir(dst):
        if f.endswith(".fits"):
            os.remove(os.path.join(dst, f))
    print(json.dumps(info))


if __name__ == "__main__":
    main()
