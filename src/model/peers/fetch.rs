//! One node taking one blob in from its parents: which pieces it holds (each verified against the holder's
//! hash before it counts), the next piece to ask each stripe's parent for, and the prefix the runtime may
//! read. A piece that fails verification is not held: it is asked for again, of another parent.

use super::pieces::Geometry;

/// What a node holds of one blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetch {
    geometry: Geometry,
    held: Vec<bool>,
    count: u32,
    /// Pieces `0..prefix` are all held.
    prefix: u32,
}

impl Fetch {
    pub fn new(geometry: Geometry) -> Fetch {
        Fetch {
            geometry,
            held: vec![false; geometry.pieces() as usize],
            count: 0,
            prefix: 0,
        }
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn holds(&self, piece: u32) -> bool {
        self.held.get(piece as usize).copied().unwrap_or(false)
    }

    /// The next piece of `stripe` not held, from its start: what to ask its parent for (and on from).
    pub fn wanted(&self, stripe: usize) -> Option<u32> {
        self.geometry
            .stripe_from(stripe, 0)
            .find(|&piece| !self.holds(piece))
    }

    /// `piece` arrived and matched its hash; true when it is new.
    pub fn verified(&mut self, piece: u32) -> bool {
        let Some(held) = self.held.get_mut(piece as usize) else {
            return false;
        };
        if *held {
            return false;
        }
        *held = true;
        self.count += 1;
        while self.holds(self.prefix) {
            self.prefix += 1;
        }
        true
    }

    /// Bytes from the blob's start that are all verified pieces.
    pub fn prefix_bytes(&self) -> u64 {
        match self.prefix {
            0 => 0,
            held => self.geometry.range(held - 1).end,
        }
    }

    /// Every piece is held (the whole blob is then checked against its digest).
    pub fn complete(&self) -> bool {
        self.count == self.geometry.pieces()
    }

    /// Verified bytes, prefix or not.
    pub fn held_bytes(&self) -> u64 {
        (0..self.geometry.pieces())
            .filter(|&p| self.holds(p))
            .map(|p| {
                let range = self.geometry.range(p);
                range.end - range.start
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_are_asked_in_order_and_the_prefix_follows_what_is_held() {
        let mut fetch = Fetch::new(Geometry::with(10, 1, 4));
        assert_eq!(fetch.wanted(2), Some(2));
        assert!(fetch.verified(0));
        assert!(!fetch.verified(0), "once");
        assert!(fetch.verified(2));
        assert_eq!(fetch.prefix_bytes(), 1);
        assert_eq!(fetch.wanted(2), Some(6));
        assert!(fetch.verified(1));
        assert_eq!(fetch.prefix_bytes(), 3);
        for piece in 3..10 {
            assert!(!fetch.complete());
            fetch.verified(piece);
        }
        assert!(fetch.complete());
        assert_eq!(fetch.prefix_bytes(), 10);
        assert_eq!(fetch.held_bytes(), 10);
        assert_eq!(fetch.wanted(1), None);
        assert!(!fetch.verified(10), "no such piece");
    }
}
