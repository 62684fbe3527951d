//! Byte progress of pulls on a CRI-O node, from CRI-O's own counters (CRI-O 1.33's `server/image_pull.go`
//! and `server/metrics`). Pure: the files' text and the metrics page come from the backend.
//!
//! - Every progress event of containers/image adds its bytes to
//!   `container_runtime_crio_image_pulls_bytes_total{mediatype, size}`, served when `enable_metrics` is on
//!   (`metrics_host:metrics_port`, or `metrics_socket`) ([`counter_total`]).
//! - Events exist only when `pull_progress_timeout` is above 0 (its default is 0): they come every tenth
//!   of it, and at every blob's end; CRI-O cancels a pull that made no progress for the whole timeout.
//!   Neither setting is applied by a reload: CRI-O reads them at start ([`CrioProgress`]).
//! - The counter is the node's, not a pull's: its growth since the rollout began is what the node fetched,
//!   exactly; each pull's share of what is in flight is an estimate ([`CounterShares`]).

use std::collections::BTreeMap;
use std::time::Duration;

/// The counter of the bytes CRI-O's pulls fetched.
pub const PULL_BYTES: &str = "container_runtime_crio_image_pulls_bytes_total";
/// The drop-in `pinboard crio-progress on` writes: sorted before the OpenShift daemon's `50-pinned-images`
/// and after CRI-O's own `00-*`.
pub const PROGRESS_DROP_IN: &str = "40-pinboard-pull-progress.conf";
/// What `pinboard crio-progress on` sets `pull_progress_timeout` to: containerd's
/// `image_pull_progress_timeout` default. CRI-O then reports every 30 s and at each blob's end.
pub const PROGRESS_TIMEOUT: &str = "5m";

/// Where CRI-O serves its metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetricsAt {
    /// `HOST:PORT` (`metrics_host`, 0.0.0.0 and empty meaning this host, and `metrics_port`).
    Tcp(String),
    /// `metrics_socket`.
    Socket(String),
}

impl MetricsAt {
    /// `HOST:PORT` or the socket's path.
    pub fn address(&self) -> &str {
        match self {
            MetricsAt::Tcp(address) | MetricsAt::Socket(address) => address,
        }
    }
}

/// What CRI-O's configuration says of its pull bytes: where its metrics are served (None: off) and its
/// `pull_progress_timeout` (zero: no progress events, so the counter moves only when a pull ends...
/// never, as containers/image reports nothing then).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrioProgress {
    pub metrics: Option<MetricsAt>,
    pub pull_progress_timeout: Duration,
}

/// Why a file's progress settings cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {problem}")]
pub struct ProgressSettingError {
    pub file: String,
    pub problem: String,
}

impl CrioProgress {
    /// From each file's name and text, in CRI-O's order: each key as the last file that sets it says, over
    /// CRI-O's defaults (`enable_metrics = false`, `metrics_host = "127.0.0.1"`, `metrics_port = 9090`,
    /// `metrics_socket = ""`, `pull_progress_timeout = "0s"`).
    pub fn read(
        files: impl IntoIterator<Item = (String, String)>,
    ) -> Result<CrioProgress, ProgressSettingError> {
        let (mut enabled, mut host, mut port, mut socket, mut timeout) = (
            false,
            "127.0.0.1".to_string(),
            9090_i64,
            String::new(),
            Duration::ZERO,
        );
        for (file, text) in files {
            let problem = |problem: String| ProgressSettingError {
                file: file.clone(),
                problem,
            };
            let doc: toml_edit::DocumentMut = text
                .parse()
                .map_err(|e: toml_edit::TomlError| problem(e.message().to_string()))?;
            let crio = |table: &str, key: &str| doc.get("crio")?.get(table)?.get(key).cloned();
            if let Some(item) = crio("metrics", "enable_metrics") {
                enabled = item.as_bool().ok_or_else(|| {
                    problem("crio.metrics.enable_metrics is not a boolean".into())
                })?;
            }
            if let Some(item) = crio("metrics", "metrics_host") {
                host = string(&item, "crio.metrics.metrics_host").map_err(problem)?;
            }
            if let Some(item) = crio("metrics", "metrics_port") {
                port = item
                    .as_integer()
                    .ok_or_else(|| problem("crio.metrics.metrics_port is not an integer".into()))?;
            }
            if let Some(item) = crio("metrics", "metrics_socket") {
                socket = string(&item, "crio.metrics.metrics_socket").map_err(problem)?;
            }
            if let Some(item) = crio("image", "pull_progress_timeout") {
                let text = string(&item, "crio.image.pull_progress_timeout").map_err(problem)?;
                timeout = go_duration(&text).ok_or_else(|| {
                    problem(format!(
                        "crio.image.pull_progress_timeout {text:?} is not a duration"
                    ))
                })?;
            }
        }
        let metrics = enabled.then(|| match socket.is_empty() {
            false => MetricsAt::Socket(socket),
            true => {
                let host = match host.as_str() {
                    "" | "0.0.0.0" | "::" => "127.0.0.1",
                    other => other,
                };
                MetricsAt::Tcp(format!("{host}:{port}"))
            }
        });
        Ok(CrioProgress {
            metrics,
            pull_progress_timeout: timeout,
        })
    }

    /// Whether CRI-O counts pull bytes as they arrive: its metrics are served and progress events happen.
    pub fn counts_bytes(&self) -> bool {
        self.metrics.is_some() && !self.pull_progress_timeout.is_zero()
    }

    /// Why CRI-O reports no pull bytes, with what turns them on; None when it does.
    pub fn why_no_bytes(&self) -> Option<String> {
        let missing = match (self.metrics.is_some(), self.pull_progress_timeout.is_zero()) {
            (true, false) => return None,
            (false, true) => "its metrics are off and pull_progress_timeout is 0",
            (false, false) => "its metrics are off",
            (true, true) => "pull_progress_timeout is 0, so no pull reports progress",
        };
        Some(format!(
            "CRI-O reports no pull bytes: {missing}; `pinboard crio-progress on --restart` sets \
             [crio.metrics] enable_metrics = true and [crio.image] pull_progress_timeout = \
             \"{PROGRESS_TIMEOUT}\" in {PROGRESS_DROP_IN} and restarts CRI-O (running containers keep \
             running; CRI-O then also cancels a pull that moves no byte for {PROGRESS_TIMEOUT})"
        ))
    }
}

fn string(item: &toml_edit::Item, key: &str) -> Result<String, String> {
    item.as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{key} is not a string"))
}

/// A Go duration as CRI-O's configuration writes one: `0`, `30s`, `5m`, `1h30m`, `1.5s`, `500ms`; None when
/// it is not one.
pub fn go_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    match text {
        "0" => return Some(Duration::ZERO),
        "" => return None,
        _ => {}
    }
    let mut rest = text;
    let mut total = 0.0_f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Some(Duration::from_secs_f64(total))
}

/// The sum of every sample of counter `name` in a Prometheus text page; None when the page has none.
pub fn counter_total(page: &str, name: &str) -> Option<f64> {
    let samples: Vec<f64> = page
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
        .collect();
    (!samples.is_empty()).then(|| samples.iter().sum())
}

/// Done and total bytes of one pull.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shared {
    pub done: u64,
    pub total: u64,
}

/// A CRI-O node's pulls and its pull-bytes counter: what the node fetched since its rollout began is exact
/// (the counter's growth); each running pull's share of what is in flight is an estimate, in proportion to
/// what the plan says it fetches, never more than that, as CRI-O counts the node's bytes, not a pull's.
#[derive(Clone, Debug, Default)]
pub struct CounterShares {
    /// The counter when the rollout began.
    start: Option<f64>,
    /// The last reading.
    last: Option<f64>,
    /// Running pulls and what the plan says each fetches.
    running: BTreeMap<String, u64>,
    /// What the pulls that ended fetched, by the plan.
    ended: u64,
}

impl CounterShares {
    /// Begins at `counter`, the reading before any pull starts.
    pub fn starting_at(counter: f64) -> CounterShares {
        CounterShares {
            start: Some(counter),
            last: Some(counter),
            ..CounterShares::default()
        }
    }

    /// A pull starts that the plan says fetches `total` bytes.
    pub fn track(&mut self, image: &str, total: u64) {
        self.running.insert(image.to_string(), total);
    }

    /// A pull ended (pulled, failed or cancelled): what it fetched no longer shares in what is in flight.
    pub fn ended(&mut self, image: &str, pulled: bool) {
        if let Some(total) = self.running.remove(image)
            && pulled
        {
            self.ended += total;
        }
    }

    /// What the node fetched since the rollout began, by the last reading: exact.
    pub fn fetched(&self) -> u64 {
        match (self.start, self.last) {
            (Some(start), Some(last)) if last > start => (last - start) as u64,
            _ => 0,
        }
    }

    /// Takes a reading of the counter: each running pull's share of what is in flight.
    pub fn update(&mut self, counter: f64) -> Vec<(String, Shared)> {
        // A counter that went back (CRI-O restarted) counts again from 0: what was fetched before stays.
        if self.last.is_some_and(|last| counter < last) {
            self.start = Some(-(self.fetched() as f64));
        }
        self.last = Some(counter);
        let in_flight = self.fetched().saturating_sub(self.ended);
        let planned: u64 = self.running.values().sum();
        self.running
            .iter()
            .map(|(image, &total)| {
                let share = match planned {
                    0 => 0,
                    _ => (u128::from(in_flight) * u128::from(total) / u128::from(planned)) as u64,
                };
                (
                    image.clone(),
                    Shared {
                        done: share.min(total),
                        total,
                    },
                )
            })
            .collect()
    }

    /// Whether pulls other than those tracked may share the counter: more were running than one.
    pub fn estimated(&self) -> bool {
        self.running.len() > 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(texts: &[(&str, &str)]) -> Vec<(String, String)> {
        texts
            .iter()
            .map(|(f, t)| (f.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn settings_are_read_key_by_key_over_crios_defaults() {
        let none = CrioProgress::read(Vec::new()).unwrap();
        assert_eq!(none, CrioProgress::default());
        assert!(!none.counts_bytes());
        let why = none.why_no_bytes().unwrap();
        assert!(
            why.contains("its metrics are off and pull_progress_timeout is 0")
                && why.contains("pinboard crio-progress on --restart"),
            "{why}"
        );
        let on = CrioProgress::read(files(&[
            (
                "/etc/crio/crio.conf",
                "[crio.metrics]\nenable_metrics = true\nmetrics_port = 9537\n",
            ),
            (
                "10-site.conf",
                "[crio.metrics]\nmetrics_host = \"0.0.0.0\"\n",
            ),
            ("40-x", "[crio.image]\npull_progress_timeout = \"1m30s\"\n"),
        ]))
        .unwrap();
        assert_eq!(on.metrics, Some(MetricsAt::Tcp("127.0.0.1:9537".into())));
        assert_eq!(on.pull_progress_timeout, Duration::from_secs(90));
        assert!(on.counts_bytes() && on.why_no_bytes().is_none());
        // A later file that turns metrics off wins; a socket replaces host and port.
        let socket = CrioProgress::read(files(&[
            (
                "a",
                "[crio.metrics]\nenable_metrics = true\nmetrics_socket = \"/run/crio/m.sock\"\n",
            ),
            ("b", "[crio.image]\npull_progress_timeout = \"10s\"\n"),
        ]))
        .unwrap();
        assert_eq!(
            socket.metrics,
            Some(MetricsAt::Socket("/run/crio/m.sock".into()))
        );
        let off = CrioProgress::read(files(&[
            ("a", "[crio.metrics]\nenable_metrics = true\n"),
            ("b", "[crio.metrics]\nenable_metrics = false\n"),
        ]))
        .unwrap();
        assert!(
            off.why_no_bytes()
                .unwrap()
                .contains("its metrics are off and pull_progress_timeout is 0")
        );
        let err = CrioProgress::read(files(&[(
            "c",
            "[crio.image]\npull_progress_timeout = \"soon\"\n",
        )]))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "c: crio.image.pull_progress_timeout \"soon\" is not a duration"
        );
    }

    #[test]
    fn go_durations_read_as_go_writes_them() {
        assert_eq!(go_duration("0"), Some(Duration::ZERO));
        assert_eq!(go_duration("0s"), Some(Duration::ZERO));
        assert_eq!(go_duration("5m"), Some(Duration::from_secs(300)));
        assert_eq!(go_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(go_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(go_duration("500ms"), Some(Duration::from_millis(500)));
        for bad in ["", "5", "m5", "5x", "five"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_counters_samples_are_summed_and_others_left_out() {
        let page = "# HELP container_runtime_crio_image_pulls_bytes_total Bytes\n\
                    # TYPE container_runtime_crio_image_pulls_bytes_total counter\n\
                    container_runtime_crio_image_pulls_bytes_total{mediatype=\"a\",size=\"<1MiB\"} 1000\n\
                    container_runtime_crio_image_pulls_bytes_total{mediatype=\"b\",size=\"<10MiB\"} 2.5e+06\n\
                    container_runtime_crio_image_pulls_bytes_total_other 7\n\
                    container_runtime_crio_image_pulls_skipped_bytes_total{size=\"x\"} 9\n";
        assert_eq!(counter_total(page, PULL_BYTES), Some(2_501_000.0));
        assert_eq!(counter_total("# nothing\n", PULL_BYTES), None);
    }

    #[test]
    fn the_nodes_bytes_are_exact_and_each_pulls_share_an_estimate_within_its_plan() {
        let mut shares = CounterShares::starting_at(500.0);
        shares.track("a", 3_000);
        shares.track("b", 1_000);
        // 2,000 bytes in flight for two pulls of 3,000 and 1,000.
        assert_eq!(
            shares.update(2_500.0),
            [
                (
                    "a".into(),
                    Shared {
                        done: 1_500,
                        total: 3_000
                    }
                ),
                (
                    "b".into(),
                    Shared {
                        done: 500,
                        total: 1_000
                    }
                ),
            ]
        );
        assert!(shares.estimated());
        assert_eq!(shares.fetched(), 2_000);
        // b ends: its 1,000 no longer share; a has the rest, never more than its plan.
        shares.ended("b", true);
        assert_eq!(
            shares.update(4_000.0),
            [(
                "a".into(),
                Shared {
                    done: 2_500,
                    total: 3_000
                }
            )]
        );
        assert_eq!(
            shares.update(9_000.0),
            [(
                "a".into(),
                Shared {
                    done: 3_000,
                    total: 3_000
                }
            )]
        );
        assert!(!shares.estimated());
        // CRI-O restarted: its counter starts from 0, and what was fetched stays counted.
        shares.update(100.0);
        assert_eq!(shares.fetched(), 8_600);
    }
}
