//! What a node's relay and the cache holder's tracker say to each other, as JSON over the cache's
//! endpoint (with the cache's token), and how a piece is checked against the hash the holder published.
//!
//! - `GET /pinboard/v1/swarm/v2/<name>/blobs/<digest>?ns=<registry>&node=<node>&address=<peer URL>`: the
//!   node asks for its parents ([`Answer`]); the holder first makes the blob whole in its cache and cuts
//!   it ([`Cut`]), so every piece's hash comes from a blob verified against its digest. The answer names
//!   the cut by its digest ([`Cut::digest`]) and carries it whole only to a node the holder serves a
//!   stripe; the others take it from a parent and check it against that digest, so the holder sends a
//!   blob's piece hashes to a few nodes per batch, not to every node.
//! - `POST /pinboard/v1/swarm/lost?digest=&node=&stripe=&from=&why=gone|corrupt&reason=`: the node lost
//!   its parent for a stripe; the answer names its next one.
//! - `POST /pinboard/v1/swarm/done?digest=&node=`: the node holds the whole blob.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::pieces::Geometry;

pub const SWARM_PREFIX: &str = "/pinboard/v1/swarm";
/// Where a node serves its pieces to other nodes: `GET <peer URL>/pinboard/v1/pieces/<digest>` with
/// `Range` (one piece), and the cache's token.
pub const PIECES_PREFIX: &str = "/pinboard/v1/pieces/";
/// Where a node serves the cut of a blob it takes: `GET <peer URL>/pinboard/v1/cuts/<digest>`.
pub const CUTS_PREFIX: &str = "/pinboard/v1/cuts/";

/// A blob's cut as the holder published it: the geometry every node agrees on, and each piece's sha256.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cut {
    pub size: u64,
    pub piece_size: u64,
    pub stripes: usize,
    /// Lowercase hex sha256 of each piece, in order.
    pub hashes: Vec<String>,
}

impl Cut {
    /// The cut of `blob`: [`Geometry::of`] its size, each piece hashed.
    pub fn of(blob: &[u8]) -> Cut {
        let mut cutter = Cutter::new(blob.len() as u64);
        cutter.update(blob);
        cutter.finish()
    }

    pub fn geometry(&self) -> Geometry {
        Geometry::with(self.size, self.piece_size, self.stripes)
    }

    /// `sha256:<hex>` of the cut as JSON: what the tracker names it by, and what a cut taken from a parent
    /// is checked against.
    pub fn digest(&self) -> String {
        let json = serde_json::to_vec(self).expect("a cut serializes");
        format!("sha256:{}", piece_hash(&json))
    }

    /// Whether the cut is whole: one hash per piece of its geometry.
    pub fn is_consistent(&self) -> bool {
        let geometry = self.geometry();
        geometry.stripes == self.stripes && geometry.pieces() as usize == self.hashes.len()
    }

    /// Why `bytes`, said to be `piece`, are not it; None when they match its hash.
    pub fn refuses(&self, piece: u32, bytes: &[u8]) -> Option<String> {
        let range = self.geometry().range(piece);
        if bytes.len() as u64 != range.end - range.start {
            return Some(format!(
                "piece {piece} came with {} bytes, not {}",
                bytes.len(),
                range.end - range.start
            ));
        }
        let expected = self.hashes.get(piece as usize)?;
        let got = piece_hash(bytes);
        (got != *expected).then(|| {
            format!(
                "piece {piece} (bytes {}-{}) hashed sha256:{got}, the holder's is sha256:{expected}",
                range.start,
                range.end - 1
            )
        })
    }
}

/// A blob's [`Cut`] made as its bytes stream by, so the holder never holds a whole blob in memory.
pub struct Cutter {
    geometry: Geometry,
    piece: Sha256,
    /// Bytes of the current piece hashed so far.
    in_piece: u64,
    hashes: Vec<String>,
}

impl Cutter {
    /// A cutter for a blob of `size` bytes.
    pub fn new(size: u64) -> Cutter {
        Cutter::with(Geometry::of(size))
    }

    /// A cutter by `geometry` (the simulation at scale cuts small blobs as large ones).
    pub fn with(geometry: Geometry) -> Cutter {
        Cutter {
            geometry,
            piece: Sha256::new(),
            in_piece: 0,
            hashes: Vec::new(),
        }
    }

    /// The blob's next bytes.
    pub fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = (self.geometry.piece_size - self.in_piece).min(bytes.len() as u64) as usize;
            self.piece.update(&bytes[..room]);
            self.in_piece += room as u64;
            bytes = &bytes[room..];
            if self.in_piece == self.geometry.piece_size {
                self.end_piece();
            }
        }
    }

    fn end_piece(&mut self) {
        let piece = std::mem::take(&mut self.piece).finalize();
        self.hashes
            .push(piece.iter().map(|b| format!("{b:02x}")).collect());
        self.in_piece = 0;
    }

    /// The cut; the blob's last piece ends here.
    pub fn finish(mut self) -> Cut {
        if self.in_piece > 0 || self.hashes.is_empty() {
            self.end_piece();
        }
        Cut {
            size: self.geometry.size,
            piece_size: self.geometry.piece_size,
            stripes: self.geometry.stripes,
            hashes: self.hashes,
        }
    }
}

/// Lowercase hex sha256 of `bytes`.
pub fn piece_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A parent as the tracker names it to a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "camelCase")]
pub enum ParentAt {
    /// The cache's holder: the node asks its blob endpoint, where it asked the tracker.
    Holder,
    /// Another node's agent, at its peer URL.
    #[serde(rename_all = "camelCase")]
    Peer { node: String, address: String },
}

impl ParentAt {
    /// How `lost` names it: the node's name, or `holder`.
    pub fn name(&self) -> &str {
        match self {
            ParentAt::Holder => HOLDER,
            ParentAt::Peer { node, .. } => node,
        }
    }
}

/// How the `from` of a loss names the holder.
pub const HOLDER: &str = "holder";

/// The tracker's answer to a node asking for its parents (`join`) or for another (`lost`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    /// The batch is still gathering (or the holder still fetching the blob): ask again after this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// The digest of the blob's cut, once placed (join only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_digest: Option<String>,
    /// The cut itself, to a node one of whose parents is the holder; the others take it from a parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<Cut>,
    /// The node's parent per stripe (join), or the one new parent (lost).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<ParentAt>,
    /// The blob is too small to be shared (fewer pieces than stripes): every node takes it from the
    /// holder's blob endpoint, as without peers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_holder: bool,
}

impl Answer {
    /// Whether a blob of `size` bytes is shared among the nodes: it has a piece for every stripe (a
    /// smaller one would make each tree a chain, one hop per node).
    pub fn shared(size: u64) -> bool {
        Geometry::of(size).stripes == super::pieces::STRIPES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_is_refused_unless_its_bytes_hash_to_the_holders() {
        let blob: Vec<u8> = (0..700_000u32).map(|i| (i % 251) as u8).collect();
        let cut = Cut::of(&blob);
        assert!(cut.is_consistent());
        assert_eq!(cut.hashes.len(), 3, "256 KiB pieces");
        let second = cut.geometry().range(1);
        let mut bytes = blob[second.start as usize..second.end as usize].to_vec();
        assert_eq!(cut.refuses(1, &bytes), None);
        bytes[17] ^= 1;
        let why = cut.refuses(1, &bytes).expect("a flipped bit");
        assert!(why.contains("piece 1 (bytes 262144-524287)"), "{why}");
        assert!(cut.refuses(1, &bytes[..10]).unwrap().contains("10 bytes"));
        // Cut as it streams by, in any chunks: the same hashes.
        let mut cutter = Cutter::new(blob.len() as u64);
        for chunk in blob.chunks(100_003) {
            cutter.update(chunk);
        }
        assert_eq!(cutter.finish(), cut);
        // The digest the tracker names it by: any other hash, another digest.
        let digest = cut.digest();
        assert!(
            digest.starts_with("sha256:") && digest.len() == 71,
            "{digest}"
        );
        let mut other = cut.clone();
        other.hashes[2] = piece_hash(b"not the piece");
        assert_ne!(other.digest(), digest);
        let read: Cut = serde_json::from_slice(&serde_json::to_vec(&cut).unwrap()).unwrap();
        assert_eq!(read.digest(), digest);
    }

    #[test]
    fn answers_read_back_as_written() {
        let answer = Answer {
            cut: Some(Cut::of(b"abc")),
            parents: vec![
                ParentAt::Holder,
                ParentAt::Peer {
                    node: "n2".into(),
                    address: "http://10.0.0.2:5051".into(),
                },
            ],
            ..Answer::default()
        };
        let json = serde_json::to_string(&answer).unwrap();
        assert!(
            json.contains(r#"{"from":"peer","node":"n2","address":"http://10.0.0.2:5051"}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Answer>(&json).unwrap(), answer);
        // Three pieces of 256 KiB would leave a stripe empty: taken from the holder.
        assert!(!Answer::shared(768 << 10));
        assert!(Answer::shared((768 << 10) + 1));
    }
}
