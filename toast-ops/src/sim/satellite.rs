//! `SimSatellite`: observations of a satellite schedule.

use crate::astro::focalplane;
use crate::astro::scan_strategy::{
    create_satellite_schedule, scan_sampling, simulate_scan, unix_us_from_civil, SatelliteSchedule,
    ScanSampling, ScanStrategy,
};
use crate::dist::JobDistribution;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use toast_core::num::Compact;
use toast_core::observation::defaults;
use toast_core::{
    comm_of, DType, Data, Detector, ExecContext, Focalplane, Observation, OpError, Operator,
    Requirements, Telescope,
};

/// Observation metadata key of the session UID (the noise key).
pub const SESSION_UID: &str = "session_uid";

/// The years a mission may start in: the Earth's ephemeris (ERFA `epv00`)
/// covers 1900-01-01 12:00 to 2100-01-01 12:00 TT (its epoch ± 100
/// Julian years), with a year's margin at each end for the mission itself.
pub const EPHEMERIS_YEARS: std::ops::RangeInclusive<i64> = 1901..=2099;

/// Configuration of [`SimSatellite`] (TOAST's `SimSatellite` traits, plus
/// the schedule parameters of `toast_satellite_schedule`, which the
/// benchmark hard-codes; angles in degrees, periods in minutes).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimSatelliteConfig {
    /// Telescope name (its UID keys the noise). The default is the name
    /// `toast_benchmark_satellite` gives its telescope, `"satellite"`, so
    /// that the noise realisation is TOAST's.
    pub telescope: String,
    /// Opening angle of the spin axis from the precession axis (deg).
    pub prec_angle: f64,
    /// Opening angle of the boresight from the spin axis (deg).
    pub spin_angle: f64,
    /// Precession period (min).
    pub prec_period: f64,
    /// Spin period (min).
    pub spin_period: f64,
    /// Length of one observation (min).
    pub obs_minutes: f64,
    /// Gap between observations (min).
    pub gap_minutes: f64,
    /// Mission start, `YYYY-MM-DD` (00:00:00 UTC).
    pub mission_start: String,
    /// Detector-set key (TOAST's `detset_key`; only `pixel` is supported).
    pub detset_key: String,
}

impl Default for SimSatelliteConfig {
    fn default() -> Self {
        SimSatelliteConfig {
            telescope: "satellite".into(),
            prec_angle: 65.0,
            spin_angle: 30.0,
            prec_period: 50.0,
            spin_period: 10.0,
            obs_minutes: 60.0,
            gap_minutes: 0.0,
            mission_start: "2027-01-01".into(),
            detset_key: "pixel".into(),
        }
    }
}

impl SimSatelliteConfig {
    /// Check the values; errors name the key.
    pub fn validate(&self) -> Result<(), OpError> {
        let bad = |k: &str, m: String| Err(OpError::Config(format!("sim_satellite.{k}: {m}")));
        for (k, v) in [
            ("prec_angle", self.prec_angle),
            ("spin_angle", self.spin_angle),
        ] {
            if !v.is_finite() {
                return bad(k, format!("{} is not a finite angle", Compact(v)));
            }
        }
        for (k, v) in [
            ("prec_period", self.prec_period),
            ("spin_period", self.spin_period),
            ("obs_minutes", self.obs_minutes),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(k, format!("{} must be positive", Compact(v)));
            }
        }
        if !(self.gap_minutes.is_finite() && self.gap_minutes >= 0.0) {
            return bad(
                "gap_minutes",
                format!("{} must be ≥ 0", Compact(self.gap_minutes)),
            );
        }
        self.mission_start_us()?;
        if self.detset_key != "pixel" {
            return bad(
                "detset_key",
                format!("{:?}: only \"pixel\" is supported", self.detset_key),
            );
        }
        Ok(())
    }

    /// The mission start in microseconds since the Unix epoch: a date of
    /// the Gregorian calendar within [`EPHEMERIS_YEARS`].
    pub fn mission_start_us(&self) -> Result<i64, OpError> {
        let err = || {
            OpError::Config(format!(
                "sim_satellite.mission_start: {:?} is not a date YYYY-MM-DD",
                self.mission_start
            ))
        };
        let p: Vec<&str> = self.mission_start.split('-').collect();
        if p.len() != 3 {
            return Err(err());
        }
        let n: Vec<i64> = p
            .iter()
            .map(|s| s.parse::<i64>().map_err(|_| err()))
            .collect::<Result<_, _>>()?;
        let (year, month, day) = (n[0], n[1], n[2]);
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
        let days = match month {
            2 if leap => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            1..=12 => 31,
            _ => return Err(err()),
        };
        if !(1..=days).contains(&day) {
            return Err(OpError::Config(format!(
                "sim_satellite.mission_start: {:?} is not a date (month {month} of {year} has \
                 {days} days)",
                self.mission_start
            )));
        }
        if !EPHEMERIS_YEARS.contains(&year) {
            return Err(OpError::Config(format!(
                "sim_satellite.mission_start: {:?} is outside the years of the Earth's \
                 ephemeris (ERFA epv00), {} to {}",
                self.mission_start,
                EPHEMERIS_YEARS.start(),
                EPHEMERIS_YEARS.end()
            )));
        }
        Ok(unix_us_from_civil(year, month, day, 0, 0, 0))
    }

    /// The schedule of the mission's first `n_obs` observations and their
    /// sampling at `rate` Hz (TOAST's `create_satellite_schedule` and
    /// `SimSatellite`'s layout): the one place the observations' sample
    /// counts come from, for the simulation and for the sizes checked
    /// before it. They need not be equal (a start between two samples
    /// rounds up, a gap adds one), nor `rate` × the observation's length.
    pub fn schedule(
        &self,
        n_obs: usize,
        rate: f64,
    ) -> Result<(SatelliteSchedule, Vec<ScanSampling>), OpError> {
        let schedule = create_satellite_schedule(
            "",
            self.mission_start_us()?,
            self.obs_minutes * 60.0,
            self.gap_minutes * 60.0,
            n_obs,
            self.prec_period * 60.0,
            self.spin_period * 60.0,
        )
        .map_err(sat_err)?;
        let layout = scan_sampling(&schedule, rate).map_err(sat_err)?;
        Ok((schedule, layout))
    }
}

/// Convert the benchmark focal plane to toast-core detectors (TOAST's units:
/// NET K√s, frequencies Hz, FWHM arcmin, band GHz).
pub fn core_focalplane(fp: &focalplane::Focalplane) -> Result<Focalplane, OpError> {
    let dets = fp
        .detectors
        .iter()
        .map(|d| {
            let mut c = Detector::new(d.name.clone());
            c.uid = d.uid as u64;
            c.quat = d.quat;
            c.gamma = d.gamma;
            c.psi_pol = d.psi_pol;
            c.pol_leakage = d.pol_leakage;
            c.pol_efficiency = d.pol_efficiency;
            c.net = d.psd_net;
            c.fknee = d.psd_fknee;
            c.fmin = d.psd_fmin;
            c.alpha = d.psd_alpha;
            c.fwhm = d.fwhm_arcmin;
            c.bandcenter = d.bandcenter_ghz;
            c.bandwidth = d.bandwidth_ghz;
            c.pixel = d.pixel.clone();
            c
        })
        .collect();
    Ok(Focalplane::new(dets, fp.sample_rate)?)
}

/// Creates this process's share of the observations `first .. first +
/// n_obs` of the schedule: its group's observations, holding its detector
/// sets ([`SimSatellite::plan`]; all of them in one process). See the module
/// documentation of [`crate::sim`].
#[derive(Debug, Clone)]
pub struct SimSatellite {
    name: String,
    /// The configuration.
    pub config: SimSatelliteConfig,
    focalplane: Arc<Focalplane>,
    /// First observation of the schedule to simulate.
    pub first: usize,
    /// Number of observations.
    pub n_obs: usize,
    /// Processes per group (0: all processes form one group). The split of
    /// observations and detectors is [`crate::dist::JobDistribution`]'s.
    pub group_size: usize,
}

impl SimSatellite {
    /// An operator for `n_obs` observations from schedule entry `first`.
    pub fn new(
        name: impl Into<String>,
        config: SimSatelliteConfig,
        focalplane: Arc<Focalplane>,
        first: usize,
        n_obs: usize,
    ) -> Result<Self, OpError> {
        config.validate()?;
        if focalplane.is_empty() {
            return Err(OpError::Config(
                "sim_satellite: the focalplane is empty".into(),
            ));
        }
        Ok(SimSatellite {
            name: name.into(),
            config,
            focalplane,
            first,
            n_obs,
            group_size: 0,
        })
    }

    /// The split of this operator's observations and detector sets over
    /// `n_procs` processes (the observations' sample counts come from the
    /// schedule, as in `exec`).
    pub fn plan(&self, n_procs: usize) -> Result<JobDistribution, OpError> {
        let samples = self.obs_samples()?;
        let sets: Vec<u64> = self
            .detector_sets()
            .iter()
            .map(|s| s.len() as u64)
            .collect();
        let gs = if self.group_size == 0 {
            n_procs
        } else {
            self.group_size
        };
        JobDistribution::plan(n_procs, gs, &samples, &sets)
            .map_err(|e| OpError::Config(format!("sim_satellite: distribution: {e}")))
    }

    /// The number of samples of each of this operator's observations.
    pub fn obs_samples(&self) -> Result<Vec<u64>, OpError> {
        let (_, layout) = self.schedule()?;
        Ok(layout[self.first..self.first + self.n_obs]
            .iter()
            .map(|l| l.n_samples as u64)
            .collect())
    }

    fn schedule(&self) -> Result<(SatelliteSchedule, Vec<ScanSampling>), OpError> {
        self.config
            .schedule(self.first + self.n_obs, self.focalplane.sample_rate())
    }

    /// Detector sets by pixel (TOAST's `detset_key = "pixel"`), in focal-plane order.
    pub fn detector_sets(&self) -> Vec<Vec<String>> {
        let mut sets: Vec<(String, Vec<String>)> = Vec::new();
        for d in self.focalplane.detectors() {
            match sets.iter_mut().find(|(p, _)| *p == d.pixel) {
                Some((_, v)) => v.push(d.name.clone()),
                None => sets.push((d.pixel.clone(), vec![d.name.clone()])),
            }
        }
        sets.into_iter().map(|(_, v)| v).collect()
    }
}

fn sat_err(e: crate::astro::scan_strategy::SatelliteError) -> OpError {
    OpError::Config(format!("sim_satellite: {e}"))
}

impl Operator for SimSatellite {
    fn name(&self) -> &str {
        &self.name
    }

    fn requires(&self) -> Requirements {
        Requirements::new()
    }

    fn provides(&self) -> Requirements {
        Requirements::new()
            .shared(defaults::TIMES)
            .shared(defaults::SHARED_FLAGS)
            .shared(defaults::BORESIGHT_RADEC)
            .shared(defaults::POSITION)
            .shared(defaults::VELOCITY)
            .detdata(defaults::DET_DATA)
            .detdata(defaults::DET_FLAGS)
    }

    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        let comm = comm_of(ctx);
        let plan = self.plan(comm.size())?;
        let my_obs = plan.obs_of(comm.rank());
        let my_dets: Vec<String> = self.detector_sets()[plan.detsets_of(comm.rank())]
            .iter()
            .flatten()
            .cloned()
            .collect();
        let c = &self.config;
        let rate = self.focalplane.sample_rate();
        let (schedule, layout) = self.schedule()?;
        let strategy = ScanStrategy {
            prec_angle: c.prec_angle.to_radians(),
            spin_angle: c.spin_angle.to_radians(),
            prec_period_s: c.prec_period * 60.0,
            spin_period_s: c.spin_period * 60.0,
        };
        let telescope = Telescope::new(c.telescope.clone(), Arc::clone(&self.focalplane));
        let sims: Vec<_> = (self.first + my_obs.start..self.first + my_obs.end)
            .into_par_iter()
            .map(|k| simulate_scan(&layout[k], &schedule.scans[k], rate, &strategy))
            .collect::<Result<_, _>>()
            .map_err(sat_err)?;
        for sim in sims {
            let n = sim.times.len();
            let mut ob = Observation::with_detectors(
                sim.sampling.obs_name.clone(),
                telescope.clone(),
                n,
                &my_dets,
            )?;
            ob.set_uid(sim.sampling.obs_uid as u64);
            ob.shared.set(defaults::TIMES, &[], &sim.times)?;
            ob.shared
                .set::<u8>(defaults::SHARED_FLAGS, &[], &vec![0; n])?;
            let flat = |v: &[[f64; 4]]| v.iter().flatten().copied().collect::<Vec<f64>>();
            ob.shared
                .set(defaults::BORESIGHT_RADEC, &[4], &flat(&sim.boresight))?;
            let flat3 = |v: &[[f64; 3]]| v.iter().flatten().copied().collect::<Vec<f64>>();
            ob.shared
                .set(defaults::POSITION, &[3], &flat3(&sim.position))?;
            ob.shared
                .set(defaults::VELOCITY, &[3], &flat3(&sim.velocity))?;
            ob.detdata
                .create(defaults::DET_DATA, DType::F64, &[], None)?;
            ob.detdata.get_mut(defaults::DET_DATA)?.set_units("K");
            ob.detdata
                .create(defaults::DET_FLAGS, DType::U8, &[], None)?;
            ob.meta
                .set("session_name", sim.sampling.session_name.as_str());
            ob.meta.set(SESSION_UID, sim.sampling.session_uid as i64);
            ob.meta
                .set("sample_offset", sim.sampling.sample_offset as i64);
            data.push(ob)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `mission_start` is a date of the calendar within the ephemeris's
    /// years: 2027-02-30 (once taken as 2027-03-02) and year 1 (once an
    /// ERFA range error mid-run, naming no setting) are refused by name.
    #[test]
    fn the_mission_starts_on_a_calendar_date_the_ephemeris_covers() {
        let start = |date: &str| {
            SimSatelliteConfig {
                mission_start: date.into(),
                ..Default::default()
            }
            .validate()
            .map_err(|e| e.to_string())
        };
        for good in [
            "2027-01-01",
            "2028-02-29",
            "2000-02-29",
            "1901-01-01",
            "2099-12-31",
        ] {
            start(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for (bad, says) in [
            ("2027-02-30", "month 2 of 2027 has 28 days"),
            ("2027-02-29", "month 2 of 2027 has 28 days"),
            ("1900-02-29", "month 2 of 1900 has 28 days"),
            ("2027-04-31", "month 4 of 2027 has 30 days"),
            ("2027-04-00", "month 4 of 2027 has 30 days"),
            ("2027-13-01", "is not a date YYYY-MM-DD"),
            ("2027-1-1-1", "is not a date YYYY-MM-DD"),
            (
                "1-01-01",
                "outside the years of the Earth's ephemeris (ERFA epv00), 1901 to 2099",
            ),
            ("99999-01-01", "outside the years"),
        ] {
            let e = start(bad).unwrap_err();
            assert!(
                e.contains("sim_satellite.mission_start") && e.contains(says),
                "{bad}: {e}"
            );
        }
        assert_eq!(
            SimSatelliteConfig::default().mission_start_us().unwrap(),
            1_798_761_600_000_000
        );
    }
}
