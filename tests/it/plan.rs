//! `pinboard plan` against the lab: 3 real containerd nodes whose image filesystems differ, a real
//! registry, and a 20-image set with shared layers, some images already on some nodes. Every byte figure is
//! checked against a computation made here from what was pushed, and each node gets the verdict that follows.

use crate::support;

use std::collections::{BTreeMap, HashSet};

use serde_json::Value;
use support::{ImageSpec, Lab, LabConfig, LayerFormat, LayerSpec, NodeSpec, PushedImage, pinboard};

const MI: u64 = 1 << 20;
/// Limits passed to plan, and used by the hand computation below.
const MIN_FREE: u64 = 4 * MI;
const GC_HIGH_PERCENT: f64 = 85.0;

struct Scenario {
    lab: Lab,
    images: Vec<(ImageSpec, PushedImage)>,
    references: Vec<String>,
    /// Which image indexes each node holds before planning.
    preloaded: BTreeMap<&'static str, Vec<usize>>,
}

/// Two base layers, each shared by ten images; every image has a layer of its own. Images 5 and 15 are
/// eStargz (their layers state an uncompressed size), image 7 is zstd:chunked.
fn scenario() -> Scenario {
    // n1 is too small for the set, n3 fits it only by crossing the GC threshold, n2 has room.
    let lab = Lab::start(
        "plan",
        LabConfig {
            nodes: vec![
                NodeSpec::new("n1", 48 * MI),
                NodeSpec::new("n2", 400 * MI),
                NodeSpec::new("n3", 94 * MI),
            ],
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let base = |seed| LayerSpec {
        seed,
        bytes: 6 * MI as usize,
        format: LayerFormat::Gzip,
    };
    let images: Vec<(ImageSpec, PushedImage)> = (0..20u64)
        .map(|i| {
            let format = match i {
                5 | 15 => LayerFormat::Estargz,
                7 => LayerFormat::ZstdChunked,
                _ => LayerFormat::Gzip,
            };
            let own = LayerSpec {
                seed: 100 + i,
                bytes: (512 * 1024 + 64 * 1024 * i) as usize,
                format,
            };
            let spec = ImageSpec {
                layers: vec![base(if i < 10 { 1 } else { 2 }), own],
                ..ImageSpec::default()
            };
            let pushed = lab
                .push_image(&format!("plan/app{i}"), &spec)
                .expect("push");
            (spec, pushed)
        })
        .collect();
    let references: Vec<String> = images
        .iter()
        .map(|(_, p)| p.reference(&lab.registry_host()))
        .collect();
    let preloaded = BTreeMap::from([("n1", vec![]), ("n2", vec![0, 1]), ("n3", vec![10, 11, 12])]);
    for (node, indexes) in &preloaded {
        for &i in indexes {
            lab.node(node).pull(&references[i]).expect("preload");
        }
    }
    Scenario {
        lab,
        images,
        references,
        preloaded,
    }
}

fn cri_args(lab: &Lab) -> Vec<String> {
    lab.nodes()
        .iter()
        .flat_map(|n| ["--cri".to_string(), format!("{}={}", n.name, n.endpoint())])
        .collect()
}

fn plan_args(s: &Scenario, list: &std::path::Path, output: &str) -> Vec<String> {
    let mut args: Vec<String> = ["plan", "--images-file"].map(String::from).to_vec();
    args.push(list.display().to_string());
    args.extend(["--insecure-registry".to_string(), s.lab.registry_host()]);
    args.extend([
        "--min-free".to_string(),
        MIN_FREE.to_string(),
        "--gc-high-percent".into(),
        "85".into(),
    ]);
    args.extend(cri_args(&s.lab));
    args.extend(["-o".to_string(), output.to_string()]);
    args
}

/// (fetch bytes, estimated disk bytes) for one node, from the pushed manifests.
fn by_hand(images: &[(ImageSpec, PushedImage)], present: &[usize]) -> (u64, u64, Vec<u64>) {
    let mut on_node: HashSet<String> = HashSet::new();
    for &i in present {
        on_node.insert(images[i].1.config_digest.clone());
        on_node.extend(images[i].1.layers.iter().map(|l| l.digest.clone()));
    }
    let (mut fetch, mut disk, mut per_image) = (0, 0, Vec::new());
    for (i, (spec, pushed)) in images.iter().enumerate() {
        let mut mine = 0;
        if !present.contains(&i) {
            if on_node.insert(pushed.config_digest.clone()) {
                mine += pushed.config_size;
                disk += pushed.config_size;
            }
            for (layer_spec, layer) in spec.layers.iter().zip(&pushed.layers) {
                if on_node.insert(layer.digest.clone()) {
                    mine += layer.size;
                    disk += match layer_spec.format {
                        LayerFormat::Estargz => layer.uncompressed_size,
                        _ => 2 * layer.size,
                    };
                }
            }
        }
        fetch += mine;
        per_image.push(mine);
    }
    (fetch, disk, per_image)
}

#[test]
fn plan_figures_match_the_manifests_and_verdicts_follow() {
    let s = scenario();
    let list = s.lab.dir().join("images.txt");
    std::fs::write(
        &list,
        format!("# plan test set\n{}\n", s.references.join("\n")),
    )
    .unwrap();

    let out = pinboard(plan_args(&s, &list, "json"));
    let stderr = &out.stderr;
    assert!(
        out.code == 0,
        "plan failed: {stderr}\nlab logs: {}",
        s.lab.dir().display()
    );
    let report: Value = serde_json::from_str(&out.stdout).expect("plan -o json prints JSON");
    let nodes = report["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3);

    let mut verdicts = Vec::new();
    for node in nodes {
        let name = node["node"].as_str().unwrap();
        let present = &s.preloaded[name];
        let (fetch, disk, per_image) = by_hand(&s.images, present);
        let stat = nix::sys::statvfs::statvfs(&s.lab.node(name).imagefs_dir()).unwrap();
        let capacity = stat.blocks() * stat.fragment_size();
        let available = stat.blocks_available() * stat.fragment_size();

        assert!(
            node["runtime"].as_str().unwrap().starts_with("containerd "),
            "{node}"
        );
        assert_eq!(node["capacityBytes"], capacity, "{name} capacity");
        assert_eq!(node["availableBytes"], available, "{name} available");
        assert_eq!(node["fetchBytes"], fetch, "{name} fetch");
        assert_eq!(node["estimatedDiskBytes"], disk, "{name} estimated disk");
        let after = available as i64 - disk as i64;
        assert_eq!(node["availableAfterBytes"], after, "{name} available after");
        for (i, image) in node["images"].as_array().unwrap().iter().enumerate() {
            assert_eq!(image["ref"], s.references[i]);
            assert_eq!(
                image["present"],
                present.contains(&i),
                "{name} image {i} present"
            );
            assert_eq!(image["fetchBytes"], per_image[i], "{name} image {i} fetch");
            let lazy = match i {
                5 | 15 => "estargz",
                7 => "zstd:chunked",
                _ => "none",
            };
            assert_eq!(image["lazyFormat"], lazy, "image {i}");
        }
        let used_after_percent = (capacity as f64 - after as f64) * 100.0 / capacity as f64;
        let expected = if after < MIN_FREE as i64 {
            "no-space"
        } else if used_after_percent > GC_HIGH_PERCENT {
            "tight"
        } else {
            "fits"
        };
        assert_eq!(node["verdict"], expected, "{name}: {node}");
        assert_eq!(
            node["reasons"].as_array().unwrap().is_empty(),
            expected == "fits",
            "{name} reasons"
        );
        verdicts.push(expected);
    }
    assert_eq!(
        verdicts,
        ["no-space", "fits", "tight"],
        "the scenario covers each verdict"
    );

    // The same survey as YAML reads back to the same document.
    let yaml = pinboard(plan_args(&s, &list, "yaml"));
    assert!(yaml.code == 0, "{}", yaml.stderr);
    let from_yaml: Value = serde_saphyr::from_str(&yaml.stdout).expect("plan -o yaml prints YAML");
    assert_eq!(from_yaml, report);

    // The table names each node with its verdict as glyph and word.
    let table = pinboard(plan_args(&s, &list, "table"));
    let table = table.stdout;
    for (node, verdict) in [("n1", "✗ no-space"), ("n2", "✓ fits"), ("n3", "! tight")] {
        let row = table
            .lines()
            .find(|l| l.starts_with(node))
            .unwrap_or_else(|| panic!("no row for {node}:\n{table}"));
        assert!(row.ends_with(verdict), "{row}");
    }
    assert!(
        table.contains("below the 4 MiB floor")
            || table.contains("more than the image filesystem has free"),
        "{table}"
    );
    assert!(
        table.contains("above the image GC high threshold of 85%"),
        "{table}"
    );
}

#[test]
fn a_multi_platform_index_resolves_to_the_nodes_platform() {
    let lab = Lab::start(
        "plan-index",
        LabConfig {
            nodes: vec![NodeSpec::new("n1", 64 * MI)],
            apiserver: false,
            ..LabConfig::default()
        },
    )
    .expect("lab starts");
    let spec = |seed, bytes| ImageSpec {
        layers: vec![LayerSpec {
            seed,
            bytes,
            format: LayerFormat::Gzip,
        }],
        ..ImageSpec::default()
    };
    let index = lab
        .push_index(
            "plan/multi",
            &[
                (support::Platform::linux_amd64(), spec(1, 300_000)),
                (
                    support::Platform::new("linux", "arm64", Some("v8")),
                    spec(2, 700_000),
                ),
            ],
        )
        .unwrap();
    let reference = index.reference(&lab.registry_host());
    for (platform, expected) in [
        ("linux/amd64", &index.manifests[0].1),
        ("linux/arm64/v8", &index.manifests[1].1),
    ] {
        let mut args: Vec<String> = [
            "plan",
            "--image",
            &reference,
            "--platform",
            platform,
            "--min-free",
            "1Mi",
        ]
        .map(String::from)
        .to_vec();
        args.extend(["--insecure-registry".to_string(), lab.registry_host()]);
        args.extend(cri_args(&lab));
        args.extend(["-o".to_string(), "json".to_string()]);
        let out = pinboard(&args);
        assert!(out.code == 0, "{}", out.stderr);
        let report: Value = serde_json::from_str(&out.stdout).unwrap();
        let layer_bytes: u64 = expected.layers.iter().map(|l| l.size).sum();
        assert_eq!(
            report["nodes"][0]["fetchBytes"],
            layer_bytes + expected.config_size,
            "{platform}"
        );
    }
}
