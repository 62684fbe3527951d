//! A real Prometheus (Debian's `prometheus` package) scraping the lab's agents: a config of static
//! targets, its own storage under the lab dir, its HTTP API on a loopback port; queries answered through
//! `/api/v1/query`, as a dashboard or an alert would ask.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::http;
use super::process::{Proc, free_port};

/// A running Prometheus; dropping it stops it.
pub struct Prometheus {
    _proc: Proc,
    url: String,
}

/// One sample of an instant vector: its labels and value.
pub type Sample = (BTreeMap<String, String>, f64);

impl Prometheus {
    /// Starts Prometheus in `dir`, scraping `targets` (`HOST:PORT`, job `pinboard-agents`) every second.
    pub fn start(dir: &Path, targets: &[String]) -> Result<Prometheus> {
        std::fs::create_dir_all(dir)?;
        let config = dir.join("prometheus.yml");
        let listed: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n- job_name: \
                 pinboard-agents\n  static_configs:\n  - targets: [{}]\n",
                listed.join(", ")
            ),
        )?;
        let port = free_port()?;
        let mut command = Command::new("prometheus");
        command
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--web.enable-lifecycle");
        let proc = Proc::spawn("prometheus", command, &dir.join("prometheus.log")).context(
            "starting prometheus (Debian's prometheus package, installed by scripts/setup)",
        )?;
        let prometheus = Prometheus {
            _proc: proc,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let http = http::agent();
        loop {
            let ready = http.get(&format!("{}/-/ready", prometheus.url)).call();
            if ready.is_ok_and(|r| r.status() == 200) {
                return Ok(prometheus);
            }
            if Instant::now() >= deadline {
                bail!("prometheus was not ready within 60 s: {}", dir.display());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The instant vector `query` gives now.
    pub fn query(&self, query: &str) -> Result<Vec<Sample>> {
        let text = http::agent()
            .get(&format!("{}/api/v1/query", self.url))
            .query("query", query)
            .call()?
            .body_mut()
            .read_to_string()?;
        let answer: Value = serde_json::from_str(&text)?;
        if answer["status"] != "success" {
            bail!("query {query}: {answer}");
        }
        Ok(answer["data"]["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|sample| {
                let labels = sample["metric"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect();
                let value = sample["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(f64::NAN);
                (labels, value)
            })
            .collect())
    }
}
