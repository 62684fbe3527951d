//! How a blob is cut for nodes serving each other: fixed-size pieces, each verified on its own against the
//! hash the cache's holder published, dealt into stripes. Stripe `s` of `k` holds pieces `s`, `s + k`,
//! `s + 2k`, …: a node takes each stripe from another parent, so the pieces of all stripes land side by
//! side and the blob's verified prefix (what the runtime reads) grows in order.

use std::ops::Range;

/// Pieces are never smaller than this: a request per piece costs a round trip.
pub const MIN_PIECE: u64 = 256 << 10;
/// Nor larger: a node forwards a piece only once it has all of it, so each hop down a tree delays the
/// stripe by one piece.
pub const MAX_PIECE: u64 = 4 << 20;
/// About this many pieces to a blob, between the two bounds.
const PIECES_PER_BLOB: u64 = 1024;
/// Stripes of a blob: how many parents a node takes it from, and how many children it serves in the one
/// tree where it forwards.
pub const STRIPES: usize = 4;

/// The cut of one blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub size: u64,
    pub piece_size: u64,
    pub stripes: usize,
}

impl Geometry {
    /// The cut every node and the holder agree on for a blob of `size` bytes: about
    /// [`PIECES_PER_BLOB`] pieces of a power of two between [`MIN_PIECE`] and [`MAX_PIECE`], in
    /// [`STRIPES`] stripes (fewer when the blob has fewer pieces).
    pub fn of(size: u64) -> Geometry {
        let piece_size = size
            .div_ceil(PIECES_PER_BLOB)
            .next_power_of_two()
            .clamp(MIN_PIECE, MAX_PIECE);
        Geometry::with(size, piece_size, STRIPES)
    }

    /// A cut of `size` bytes into pieces of `piece_size` in at most `stripes` stripes.
    pub fn with(size: u64, piece_size: u64, stripes: usize) -> Geometry {
        let pieces = size.div_ceil(piece_size.max(1)).max(1);
        Geometry {
            size,
            piece_size: piece_size.max(1),
            stripes: stripes.clamp(1, usize::try_from(pieces).unwrap_or(usize::MAX)),
        }
    }

    /// How many pieces (an empty blob has one, empty).
    pub fn pieces(&self) -> u32 {
        u32::try_from(self.size.div_ceil(self.piece_size).max(1)).unwrap_or(u32::MAX)
    }

    /// The bytes of `piece`.
    pub fn range(&self, piece: u32) -> Range<u64> {
        let start = (u64::from(piece) * self.piece_size).min(self.size);
        start..(start + self.piece_size).min(self.size)
    }

    pub fn stripe_of(&self, piece: u32) -> usize {
        piece as usize % self.stripes
    }

    /// The pieces of `stripe` from `from` on (the first of them at or after `from`), in order.
    pub fn stripe_from(&self, stripe: usize, from: u32) -> impl Iterator<Item = u32> + use<> {
        let k = self.stripes as u32;
        let s = stripe as u32;
        let first = match from <= s {
            true => s,
            false => from + (k - (from - s) % k) % k,
        };
        (first..self.pieces()).step_by(self.stripes)
    }

    /// Bytes of `stripe`.
    pub fn stripe_bytes(&self, stripe: usize) -> u64 {
        self.stripe_from(stripe, 0)
            .map(|piece| {
                let range = self.range(piece);
                range.end - range.start
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;

    #[test]
    fn pieces_grow_with_the_blob_between_their_bounds() {
        assert_eq!(Geometry::of(3 * MI).piece_size, MIN_PIECE);
        assert_eq!(Geometry::of(3 * MI).pieces(), 12);
        assert_eq!(Geometry::of(1_500_000_000).piece_size, 2 * MI);
        assert_eq!(Geometry::of(1_500_000_000).pieces(), 716);
        assert_eq!(Geometry::of(40_000 * MI).piece_size, MAX_PIECE);
        // A blob smaller than four pieces has as many stripes as pieces.
        assert_eq!(Geometry::of(300 << 10).stripes, 2);
        assert_eq!(Geometry::of(0).pieces(), 1);
        assert_eq!(Geometry::of(0).range(0), 0..0);
    }

    #[test]
    fn stripes_deal_the_pieces_in_turn_and_cover_the_blob_once() {
        let g = Geometry::with(10 * MI + 5, MI, 4);
        assert_eq!(g.pieces(), 11);
        assert_eq!(g.range(10), 10 * MI..10 * MI + 5);
        assert_eq!(g.stripe_from(1, 0).collect::<Vec<_>>(), [1, 5, 9]);
        assert_eq!(g.stripe_from(1, 2).collect::<Vec<_>>(), [5, 9]);
        assert_eq!(g.stripe_from(1, 5).collect::<Vec<_>>(), [5, 9]);
        assert_eq!(g.stripe_from(3, 8).collect::<Vec<_>>(), Vec::<u32>::new());
        assert_eq!(g.stripe_of(9), 1);
        let total: u64 = (0..4).map(|s| g.stripe_bytes(s)).sum();
        assert_eq!(total, g.size);
    }
}
