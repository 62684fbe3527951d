//! Prometheus' text exposition format (version 0.0.4), written purely: each family's `# HELP` and `# TYPE`
//! lines, then its samples with their labels (values escaped), and histograms as their cumulative
//! `_bucket{le}`, `_sum` and `_count` series.

use std::fmt::Write as _;

/// What kind of metric a family is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
    Histogram,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        }
    }
}

/// Observations in buckets of fixed upper bounds.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bound, the observations at most that bound and above the one before (not cumulative).
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        if let Some(at) = self.bounds.iter().position(|b| value <= *b) {
            self.counts[at] += 1;
        }
        self.sum += value;
        self.count += 1;
    }
}

/// A metrics page being written.
#[derive(Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// Starts family `name`: what it means and its kind. Its samples follow.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {}", kind.word());
    }

    /// One sample of the family just started.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        write_labels(&mut self.text, labels, None);
        let _ = writeln!(self.text, " {}", number(value));
    }

    /// A histogram's series for `labels`.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], histogram: &Histogram) {
        let mut cumulative = 0;
        for (bound, count) in histogram.bounds.iter().zip(&histogram.counts) {
            cumulative += count;
            let _ = write!(self.text, "{name}_bucket");
            write_labels(&mut self.text, labels, Some(&number(*bound)));
            let _ = writeln!(self.text, " {cumulative}");
        }
        let _ = write!(self.text, "{name}_bucket");
        write_labels(&mut self.text, labels, Some("+Inf"));
        let _ = writeln!(self.text, " {}", histogram.count);
        self.sample(&format!("{name}_sum"), labels, histogram.sum);
        self.sample(&format!("{name}_count"), labels, histogram.count as f64);
    }

    pub fn finish(self) -> String {
        self.text
    }
}

fn write_labels(text: &mut String, labels: &[(&str, &str)], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    text.push('{');
    let mut first = true;
    for (key, value) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
        if !first {
            text.push(',');
        }
        first = false;
        let value = value
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let _ = write!(text, "{key}=\"{value}\"");
    }
    text.push('}');
}

/// A value as the format writes it: integers without a fraction.
fn number(value: f64) -> String {
    if value.is_finite() && value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        format!("{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_histograms_read_as_prometheus_writes_them() {
        let mut page = Exposition::default();
        page.family(
            "pinboard_set_images",
            Kind::Gauge,
            "Images of a set on the node, by state.",
        );
        page.sample(
            "pinboard_set_images",
            &[("node", "n1"), ("set", "we\"b"), ("state", "pinned")],
            3.0,
        );
        let mut durations = Histogram::new(&[1.0, 5.0]);
        for seconds in [0.5, 3.0, 7.5] {
            durations.observe(seconds);
        }
        page.family(
            "pinboard_pull_duration_seconds",
            Kind::Histogram,
            "How long pulls took.",
        );
        page.histogram(
            "pinboard_pull_duration_seconds",
            &[("node", "n1")],
            &durations,
        );
        assert_eq!(
            page.finish(),
            "# HELP pinboard_set_images Images of a set on the node, by state.\n\
             # TYPE pinboard_set_images gauge\n\
             pinboard_set_images{node=\"n1\",set=\"we\\\"b\",state=\"pinned\"} 3\n\
             # HELP pinboard_pull_duration_seconds How long pulls took.\n\
             # TYPE pinboard_pull_duration_seconds histogram\n\
             pinboard_pull_duration_seconds_bucket{node=\"n1\",le=\"1\"} 1\n\
             pinboard_pull_duration_seconds_bucket{node=\"n1\",le=\"5\"} 2\n\
             pinboard_pull_duration_seconds_bucket{node=\"n1\",le=\"+Inf\"} 3\n\
             pinboard_pull_duration_seconds_sum{node=\"n1\"} 11\n\
             pinboard_pull_duration_seconds_count{node=\"n1\"} 3\n"
        );
    }
}
