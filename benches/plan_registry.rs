//! Benchmark: `pinboard plan` for 500 images against the lab registry behind a proxy adding 20 ms to every
//! request, against a sequential `skopeo inspect --raw` loop over the same references (the per-image
//! inspect the OpenShift daemon runs before it pulls). Goal: pinboard at least 30x faster.
//!
//!     cargo bench --bench plan_registry            # PINBOARD_BENCH_IMAGES=500, PINBOARD_BENCH_DELAY_MS=20
//!
//! Prints one line per contender and the ratio; results go in BENCHMARKS.md.

mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use common::env_number;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec};

fn main() {
    let count: usize = env_number("PINBOARD_BENCH_IMAGES", 500);
    let delay = Duration::from_millis(env_number("PINBOARD_BENCH_DELAY_MS", 20));
    let lab = Lab::start(
        "bench-plan",
        LabConfig {
            nodes: vec![NodeSpec::new("n1", 64 << 20)],
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("lab starts");

    let pushing = Instant::now();
    let base = LayerSpec {
        seed: 1,
        bytes: 64 << 10,
        format: LayerFormat::Gzip,
    };
    let references: Vec<String> = (0..count as u64)
        .map(|i| {
            let own = LayerSpec {
                seed: 1000 + i,
                bytes: 4 << 10,
                format: LayerFormat::Gzip,
            };
            let spec = ImageSpec {
                layers: vec![base.clone(), own],
                ..ImageSpec::default()
            };
            lab.push_image(&format!("bench/app{i}"), &spec)
                .expect("push")
                .reference(&lab.proxy_host())
        })
        .collect();
    eprintln!("pushed {count} images in {:.1?}", pushing.elapsed());
    let list = lab.dir().join("bench-images.txt");
    std::fs::write(&list, references.join("\n")).unwrap();
    lab.proxy().set_delay(delay);

    let before = lab.proxy().requests();
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_pinboard"))
        .args([
            "plan",
            "--images-file",
            &list.display().to_string(),
            "--insecure-registry",
            &lab.proxy_host(),
        ])
        .args([
            "--cri",
            &format!("n1={}", lab.node("n1").endpoint()),
            "--min-free",
            "1Mi",
            "-o",
            "json",
        ])
        .output()
        .expect("pinboard runs");
    let pinboard_time = started.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pinboard_requests = lab.proxy().requests() - before;

    let before = lab.proxy().requests();
    let started = Instant::now();
    for reference in &references {
        let status = Command::new("skopeo")
            .args([
                "inspect",
                "--raw",
                "--tls-verify=false",
                &format!("docker://{reference}"),
            ])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("skopeo runs");
        assert!(status.success(), "skopeo inspect {reference}");
    }
    let skopeo_time = started.elapsed();
    let skopeo_requests = lab.proxy().requests() - before;

    println!("images: {count}, proxy delay per request: {delay:?}");
    println!(
        "pinboard plan:               {pinboard_time:>10.2?}  ({pinboard_requests} registry requests)"
    );
    println!(
        "sequential skopeo inspect:   {skopeo_time:>10.2?}  ({skopeo_requests} registry requests)"
    );
    println!(
        "speed-up: {:.1}x",
        skopeo_time.as_secs_f64() / pinboard_time.as_secs_f64()
    );
}
