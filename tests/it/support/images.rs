//! Deterministic test images: layers, OCI configs, manifests and indexes generated from small specs, and
//! pushed to the lab registry. The same spec always gives the same bytes and so the same digests.
//!
//! A layer is a tar holding one file of `bytes` pseudo-random bytes (splitmix64 seeded with `seed`), with
//! fixed header fields. Its uncompressed content depends only on `seed` and `bytes`, so a gzip and a zstd
//! layer of the same seed have the same diff ID, as the same content compressed two ways has in real life.
//! Formats:
//! - gzip: plain `tar+gzip`.
//! - eStargz: the same gzip blob with the eStargz annotations (TOC digest, uncompressed size). The TOC is
//!   not embedded in the blob: nothing in the lab reads it, and nodes pull the layer as plain gzip, as
//!   containerd without the stargz snapshotter does with real eStargz layers.
//! - zstd:chunked: a real `tar+zstd` stream followed by a zstd skippable frame that holds the
//!   zstd-compressed TOC, which the `manifest-position` and `manifest-checksum` annotations point to (the
//!   trailing footer of the containers/storage format is left out).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use anyhow::Result;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::registry::Registry;

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX_TYPE: &str = "application/vnd.oci.image.index.v1+json";
const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const GZIP_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const ZSTD_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
/// Every timestamp in generated images (tar headers, config): 2000-01-01T00:00:00Z.
pub(crate) const EPOCH: u64 = 946_684_800;
const CREATED: &str = "2000-01-01T00:00:00Z";
/// Fast levels: the content is random, so higher levels would only cost time.
const GZIP_LEVEL: u32 = 1;
const ZSTD_LEVEL: i32 = 1;

/// One layer: a single file of `bytes` pseudo-random bytes from `seed`, compressed as `format`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LayerSpec {
    pub seed: u64,
    pub bytes: usize,
    pub format: LayerFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerFormat {
    Gzip,
    /// gzip plus the annotations `containerd.io/snapshot/stargz/toc.digest` and
    /// `io.containers.estargz.uncompressed-size`.
    Estargz,
    /// `application/vnd.oci.image.layer.v1.tar+zstd` with the annotations
    /// `io.github.containers.zstd-chunked.manifest-checksum` and `...manifest-position`.
    ZstdChunked,
}

/// An image: its layers (bottom first) and its manifest annotations.
#[derive(Clone, Debug, Default)]
pub struct ImageSpec {
    pub layers: Vec<LayerSpec>,
    pub annotations: BTreeMap<String, String>,
}

impl ImageSpec {
    /// A small image: one 64 KiB gzip layer of bytes from `seed`.
    pub fn small(seed: u64) -> ImageSpec {
        ImageSpec::gzip_layers(seed, &[64 * 1024])
    }

    /// One gzip layer per entry of `bytes` (that many bytes each), from `seed`, `seed + 1`, ...
    pub fn gzip_layers(seed: u64, bytes: &[usize]) -> ImageSpec {
        ImageSpec {
            layers: (seed..)
                .zip(bytes)
                .map(|(seed, &bytes)| LayerSpec {
                    seed,
                    bytes,
                    format: LayerFormat::Gzip,
                })
                .collect(),
            ..ImageSpec::default()
        }
    }
}

/// An OCI platform, as in an image config and an index entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Platform {
    pub fn new(os: &str, architecture: &str, variant: Option<&str>) -> Platform {
        Platform {
            os: os.to_owned(),
            architecture: architecture.to_owned(),
            variant: variant.map(str::to_owned),
        }
    }

    pub fn linux_amd64() -> Platform {
        Platform::new("linux", "amd64", None)
    }

    /// The `os`, `architecture` and (if any) `variant` fields, as in configs and index entries.
    fn to_json(&self) -> serde_json::Map<String, Value> {
        let mut object = serde_json::Map::new();
        object.insert("os".into(), self.os.clone().into());
        object.insert("architecture".into(), self.architecture.clone().into());
        if let Some(variant) = &self.variant {
            object.insert("variant".into(), variant.clone().into());
        }
        object
    }
}

/// An image manifest as pushed to the registry, by digest.
#[derive(Clone, Debug)]
pub struct PushedImage {
    pub repo: String,
    pub manifest_digest: String,
    pub manifest_size: u64,
    pub config_digest: String,
    pub config_size: u64,
    pub layers: Vec<PushedLayer>,
}

/// Unique bytes of `images` as they cross the link: every manifest, config and layer once.
pub fn unique_bytes(images: &[PushedImage]) -> u64 {
    let mut blobs = std::collections::BTreeMap::new();
    for image in images {
        blobs.insert(&image.config_digest, image.config_size);
        blobs.insert(&image.manifest_digest, image.manifest_size);
        for l in &image.layers {
            blobs.insert(&l.digest, l.size);
        }
    }
    blobs.values().sum()
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushedLayer {
    pub digest: String,
    /// Compressed size, as in the manifest.
    pub size: u64,
    pub uncompressed_size: u64,
    pub media_type: String,
}

impl PushedImage {
    /// `HOST/REPO@sha256:...`
    pub fn reference(&self, host: &str) -> String {
        format!("{host}/{}@{}", self.repo, self.manifest_digest)
    }
}

/// A multi-platform image index as pushed to the registry, by digest, with its platform manifests.
#[derive(Clone, Debug)]
pub struct PushedIndex {
    pub repo: String,
    pub digest: String,
    pub manifests: Vec<(Platform, PushedImage)>,
}

impl PushedIndex {
    /// `HOST/REPO@sha256:...` of the index.
    pub fn reference(&self, host: &str) -> String {
        format!("{host}/{}@{}", self.repo, self.digest)
    }
}

/// `sha256:<hex>` of `bytes`.
pub(crate) fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

/// Layers built so far in a lab, by spec, so that a layer shared by several images is compressed and hashed
/// once (it is built again only if the registry does not have it).
#[derive(Default)]
pub(crate) struct LayerCache(Mutex<HashMap<LayerSpec, LayerMeta>>);

/// A layer built elsewhere (e.g. a release payload's manifests), pushed as it is after the generated ones.
#[derive(Clone, Debug)]
pub struct BuiltLayer {
    pub blob: Vec<u8>,
    /// The uncompressed tar's digest.
    pub diff_id: String,
    pub uncompressed_size: u64,
    pub media_type: &'static str,
}

impl BuiltLayer {
    /// A gzip tar of `tar`.
    pub fn gzip(tar: &[u8]) -> Result<BuiltLayer> {
        Ok(BuiltLayer {
            blob: gzip(tar)?,
            diff_id: sha256_digest(tar),
            uncompressed_size: len_u64(tar),
            media_type: GZIP_TYPE,
        })
    }
}

/// What an image is made of beyond its generated layers: built layers on top, and config labels.
#[derive(Clone, Debug, Default)]
pub(crate) struct Extras<'a> {
    pub built: &'a [BuiltLayer],
    pub labels: BTreeMap<String, String>,
    /// Also push the manifest under this tag.
    pub tag: Option<&'a str>,
    /// The config's `Entrypoint`, unless empty.
    pub entrypoint: Vec<String>,
}

/// Builds the image's blobs and pushes them (each blob once per registry) and its manifest.
pub(crate) fn push_image(
    registry: &Registry,
    cache: &LayerCache,
    repo: &str,
    spec: &ImageSpec,
    platform: &Platform,
) -> Result<PushedImage> {
    push_image_with(registry, cache, repo, spec, platform, &Extras::default())
}

/// [`push_image`] with `extras` on top.
pub(crate) fn push_image_with(
    registry: &Registry,
    cache: &LayerCache,
    repo: &str,
    spec: &ImageSpec,
    platform: &Platform,
    extras: &Extras<'_>,
) -> Result<PushedImage> {
    let built = extras.built.iter().map(|layer| {
        let meta = LayerMeta::of_built(layer);
        registry.push_blob(repo, &meta.digest, &layer.blob)?;
        Ok::<_, anyhow::Error>((meta, BUILT_HISTORY.to_owned()))
    });
    let generated = spec.layers.iter().map(|layer_spec| {
        let layer = push_layer(registry, cache, repo, layer_spec)?;
        Ok((
            layer,
            format!(
                "pinboard lab layer: seed {}, {} bytes, {:?}",
                layer_spec.seed, layer_spec.bytes, layer_spec.format
            ),
        ))
    });
    let layers = generated.chain(built).collect::<Result<Vec<_>>>()?;
    let documents = ImageDocuments::new(layers, platform, extras, &spec.annotations)?;
    let (config, manifest) = (&documents.config, &documents.manifest);
    let config_digest = sha256_digest(config);
    registry.push_blob(repo, &config_digest, config)?;
    let manifest_digest = registry.put_manifest_as(repo, extras.tag, MANIFEST_TYPE, manifest)?;
    let layers = documents.layers;
    Ok(PushedImage {
        repo: repo.to_owned(),
        manifest_digest,
        manifest_size: len_u64(manifest),
        config_digest,
        config_size: len_u64(config),
        layers,
    })
}

/// The history line of a layer built elsewhere.
const BUILT_HISTORY: &str = "pinboard lab layer: built";

/// An image's config and manifest, and its layers as the manifest lists them.
struct ImageDocuments {
    config: Vec<u8>,
    manifest: Vec<u8>,
    layers: Vec<PushedLayer>,
}

impl ImageDocuments {
    /// The documents of an image of `layers` (bottom first, each with its history line) for `platform`,
    /// with the config settings of `extras` and the manifest `annotations`.
    fn new(
        layers: Vec<(LayerMeta, String)>,
        platform: &Platform,
        extras: &Extras<'_>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<ImageDocuments> {
        let mut pushed = Vec::new();
        let mut descriptors = Vec::new();
        let mut diff_ids = Vec::new();
        let mut history = Vec::new();
        for (layer, created_by) in layers {
            let mut descriptor = json!({
                "mediaType": layer.media_type,
                "digest": layer.digest,
                "size": layer.size,
            });
            if !layer.annotations.is_empty() {
                descriptor["annotations"] = json!(layer.annotations);
            }
            descriptors.push(descriptor);
            diff_ids.push(layer.diff_id.clone());
            history.push(json!({"created": CREATED, "created_by": created_by}));
            pushed.push(PushedLayer {
                digest: layer.digest,
                size: layer.size,
                uncompressed_size: layer.uncompressed_size,
                media_type: layer.media_type.to_owned(),
            });
        }

        let mut config = platform.to_json();
        config.insert("created".into(), CREATED.into());
        let mut image_config =
            json!({"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]});
        if !extras.labels.is_empty() {
            image_config["Labels"] = json!(extras.labels);
        }
        if !extras.entrypoint.is_empty() {
            image_config["Entrypoint"] = json!(extras.entrypoint);
        }
        config.insert("config".into(), image_config);
        config.insert(
            "rootfs".into(),
            json!({"type": "layers", "diff_ids": diff_ids}),
        );
        config.insert("history".into(), history.into());
        let config = serde_json::to_vec(&config)?;

        let mut manifest = json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": sha256_digest(&config), "size": config.len()},
            "layers": descriptors,
        });
        if !annotations.is_empty() {
            manifest["annotations"] = json!(annotations);
        }
        Ok(ImageDocuments {
            manifest: serde_json::to_vec(&manifest)?,
            config,
            layers: pushed,
        })
    }
}

/// A linux/amd64 image of `layers` (bottom first), with the config settings of `extras`, as an OCI image
/// layout in a tar whose index names it `name`: what `ctr images import` takes.
pub(crate) fn oci_archive(
    name: &str,
    layers: &[BuiltLayer],
    extras: &Extras<'_>,
) -> Result<Vec<u8>> {
    let metas = layers
        .iter()
        .map(|layer| (LayerMeta::of_built(layer), BUILT_HISTORY.to_owned()))
        .collect();
    let documents = ImageDocuments::new(metas, &Platform::linux_amd64(), extras, &BTreeMap::new())?;
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "manifests": [{
            "mediaType": MANIFEST_TYPE,
            "digest": sha256_digest(&documents.manifest),
            "size": documents.manifest.len(),
            "annotations": {"io.containerd.image.name": name},
        }],
    }))?;
    let mut archive = tar::Builder::new(Vec::new());
    let mut add = |path: &str, bytes: &[u8]| {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o644);
        header.set_size(len_u64(bytes));
        header.set_mtime(EPOCH);
        archive.append_data(&mut header, path, bytes)
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json", &index)?;
    let blobs = layers
        .iter()
        .map(|l| &l.blob)
        .chain([&documents.config, &documents.manifest]);
    for blob in blobs {
        let digest = sha256_digest(blob);
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        add(&format!("blobs/sha256/{hex}"), blob)?;
    }
    Ok(archive.into_inner()?)
}

/// Pushes one image per platform, then an OCI index over them.
pub(crate) fn push_index(
    registry: &Registry,
    cache: &LayerCache,
    repo: &str,
    images: &[(Platform, ImageSpec)],
) -> Result<PushedIndex> {
    let images: Vec<_> = images
        .iter()
        .map(|(platform, spec)| (platform.clone(), spec.clone(), Extras::default()))
        .collect();
    push_index_with(registry, cache, repo, &images, None)
}

/// [`push_index`] with extras per image, and the index also pushed under `tag`.
pub(crate) fn push_index_with(
    registry: &Registry,
    cache: &LayerCache,
    repo: &str,
    images: &[(Platform, ImageSpec, Extras<'_>)],
    tag: Option<&str>,
) -> Result<PushedIndex> {
    let mut manifests = Vec::new();
    let mut entries = Vec::new();
    for (platform, spec, extras) in images {
        let image = push_image_with(registry, cache, repo, spec, platform, extras)?;
        entries.push(json!({
            "mediaType": MANIFEST_TYPE,
            "digest": image.manifest_digest,
            "size": image.manifest_size,
            "platform": platform.to_json(),
        }));
        manifests.push((platform.clone(), image));
    }
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "manifests": entries,
    }))?;
    let digest = registry.put_manifest_as(repo, tag, INDEX_TYPE, &index)?;
    Ok(PushedIndex {
        repo: repo.to_owned(),
        digest,
        manifests,
    })
}

/// Makes the layer of `spec` available in `repo`, building its blob only if it was not built before or the
/// registry needs the bytes.
fn push_layer(
    registry: &Registry,
    cache: &LayerCache,
    repo: &str,
    spec: &LayerSpec,
) -> Result<LayerMeta> {
    let cached = cache.0.lock().expect("layer cache").get(spec).cloned();
    let (meta, mut blob) = match cached {
        Some(meta) => (meta, None),
        None => {
            let layer = Layer::build(spec)?;
            (layer.meta, Some(layer.blob))
        }
    };
    if let Some(upload) = registry.start_blob(repo, &meta.digest)? {
        let blob = match blob.take() {
            Some(blob) => blob,
            None => Layer::build(spec)?.blob,
        };
        registry.finish_blob(repo, &upload, &meta.digest, &blob)?;
    }
    cache
        .0
        .lock()
        .expect("layer cache")
        .insert(spec.clone(), meta.clone());
    Ok(meta)
}

/// What a layer's descriptor and the image config need to know about it.
#[derive(Clone)]
struct LayerMeta {
    digest: String,
    size: u64,
    diff_id: String,
    uncompressed_size: u64,
    media_type: &'static str,
    annotations: BTreeMap<String, String>,
}

impl LayerMeta {
    fn of_built(layer: &BuiltLayer) -> LayerMeta {
        LayerMeta {
            digest: sha256_digest(&layer.blob),
            size: len_u64(&layer.blob),
            diff_id: layer.diff_id.clone(),
            uncompressed_size: layer.uncompressed_size,
            media_type: layer.media_type,
            annotations: BTreeMap::new(),
        }
    }
}

/// A built layer blob.
struct Layer {
    meta: LayerMeta,
    blob: Vec<u8>,
}

impl Layer {
    fn build(spec: &LayerSpec) -> Result<Layer> {
        let name = format!("data/{:016x}-{}.bin", spec.seed, spec.bytes);
        let tar = tar_one_file(&name, &random_bytes(spec.seed, spec.bytes));
        let uncompressed_size = len_u64(&tar);
        let mut annotations = BTreeMap::new();
        let (blob, media_type) = match spec.format {
            LayerFormat::Gzip => (gzip(&tar)?, GZIP_TYPE),
            LayerFormat::Estargz => {
                let toc = json!({
                    "version": 1,
                    "entries": [{"name": name, "type": "reg", "size": spec.bytes}],
                });
                annotations.insert(
                    "containerd.io/snapshot/stargz/toc.digest".to_owned(),
                    sha256_digest(toc.to_string().as_bytes()),
                );
                annotations.insert(
                    "io.containers.estargz.uncompressed-size".to_owned(),
                    uncompressed_size.to_string(),
                );
                (gzip(&tar)?, GZIP_TYPE)
            }
            LayerFormat::ZstdChunked => {
                let mut blob = zstd::encode_all(&tar[..], ZSTD_LEVEL)?;
                let toc = json!({
                    "version": 1,
                    "entries": [{
                        "type": "reg", "name": name, "size": spec.bytes,
                        "offset": 0, "endOffset": blob.len(),
                    }],
                })
                .to_string();
                let compressed_toc = zstd::encode_all(toc.as_bytes(), ZSTD_LEVEL)?;
                // A zstd skippable frame (magic 0x184D2A50, little-endian payload length): decompressors
                // skip it, so the layer still decompresses to exactly the tar.
                blob.extend_from_slice(&0x184D_2A50_u32.to_le_bytes());
                blob.extend_from_slice(&u32::try_from(compressed_toc.len())?.to_le_bytes());
                let offset = blob.len();
                blob.extend_from_slice(&compressed_toc);
                annotations.insert(
                    "io.github.containers.zstd-chunked.manifest-checksum".to_owned(),
                    sha256_digest(&compressed_toc),
                );
                annotations.insert(
                    "io.github.containers.zstd-chunked.manifest-position".to_owned(),
                    format!("{offset}:{}:{}:1", compressed_toc.len(), toc.len()),
                );
                (blob, ZSTD_TYPE)
            }
        };
        let meta = LayerMeta {
            digest: sha256_digest(&blob),
            size: len_u64(&blob),
            diff_id: sha256_digest(&tar),
            uncompressed_size,
            media_type,
            annotations,
        };
        Ok(Layer { meta, blob })
    }
}

fn len_u64(bytes: &[u8]) -> u64 {
    u64::try_from(bytes.len()).expect("length fits u64")
}

/// `len` bytes from a splitmix64 generator seeded with `seed`.
pub(crate) fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A ustar archive holding one regular file (mode 0644, root:root, mtime [`EPOCH`]).
fn tar_one_file(name: &str, content: &[u8]) -> Vec<u8> {
    /// Writes `value` as zero-padded octal filling the field, NUL-terminated.
    fn octal(field: &mut [u8], value: u64) {
        let text = format!("{value:0width$o}\0", width = field.len() - 1);
        field.copy_from_slice(text.as_bytes());
    }
    assert!(name.len() < 100, "tar name too long: {name}");
    let mut header = [0u8; 512];
    header[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut header[100..108], 0o644);
    octal(&mut header[108..116], 0);
    octal(&mut header[116..124], 0);
    octal(&mut header[124..136], len_u64(content));
    octal(&mut header[136..148], EPOCH);
    header[156] = b'0';
    header[257..265].copy_from_slice(b"ustar\x0000");
    header[265..269].copy_from_slice(b"root");
    header[297..301].copy_from_slice(b"root");
    // The checksum is computed with its own field as spaces, then stored as 6 octal digits, NUL, space.
    header[148..156].fill(b' ');
    let sum: u64 = header.iter().map(|&b| u64::from(b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());

    let padded = content.len().div_ceil(512) * 512;
    let mut tar = Vec::with_capacity(512 + padded + 1024);
    tar.extend_from_slice(&header);
    tar.extend_from_slice(content);
    tar.resize(512 + padded + 1024, 0); // padding, then the two zero blocks that end the archive
    tar
}

/// gzip without file name or timestamp, so equal input gives equal output.
fn gzip(data: &[u8]) -> Result<Vec<u8>> {
    use std::io::Write as _;
    let mut encoder =
        flate2::GzBuilder::new().write(Vec::new(), flate2::Compression::new(GZIP_LEVEL));
    encoder.write_all(data)?;
    Ok(encoder.finish()?)
}
