//! The tracker: who takes which stripe of one blob from whom. The cache's holder keeps a [`Swarm`] per blob
//! and every node's relay asks it; the simulation (`benches/fan_out_scale.rs`) drives the same code.
//!
//! **A forest of stripe trees.** Nodes that ask for the blob at about the same time form a batch. Each
//! member of a batch forwards in one tree only, its *group*'s (its place in the batch modulo the number of
//! stripes), where it serves up to [`Swarm::fan_out`] children; in the other trees it is a leaf. The
//! holder serves each tree's first member only. Within a tree the forwarding members form a heap in batch
//! order and the leaves take the slots left below them. So every node takes in each stripe once, sends
//! out about as much as it takes in, and is at most `log(n / k) + 2` hops from the holder: a set reaches
//! n nodes in the time one node takes plus a few pieces per hop, not n times it. (SplitStream's forest,
//! built per batch.)
//!
//! **Batches.** The first member asking opens a batch; it closes when as many members as the holder
//! expects (the nodes with an agent) have asked, or once no member came for [`BATCH_QUIET`] (at most
//! [`BATCH_WINDOW`] after it opened), whichever is first. A batch that keeps gathering stays open: at
//! thousands of nodes the joins queue at the tracker for longer than a fixed window, which would cut the
//! nodes into batches hung one below the other. Until it closes a member is told to ask again. A member asking once the batch closed starts a new one; a later batch
//! hangs its trees from the least loaded members of earlier ones (or the holder), which hold the blob or
//! are well on their way.
//!
//! **Losses.** A member whose parent broke a stripe off (gone: its connection refused or reset, its
//! stream stalled) or sent a piece that failed verification (corrupt: dropped, and named with why) asks
//! for another. It gets the least loaded member that holds the stripe or takes it from elsewhere than
//! itself (never one of its own descendants in that tree, whose bytes come through it), else the
//! holder, and resumes from the piece it stopped at. A gone or dropped member is never a parent again.
//! A gone member's own parents stop sending to it, so they are the least loaded: the upload it took is
//! what its children get, and the trees do not hang below members whose upload is already spoken for.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A batch closes once no member joined it for this long.
pub const BATCH_QUIET: Duration = Duration::from_millis(250);
/// How long a batch gathers members at most.
pub const BATCH_WINDOW: Duration = Duration::from_secs(5);

/// Where a member takes a stripe from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Parent {
    /// The cache's holder itself.
    Holder,
    /// Another node, by name.
    Peer(String),
}

/// What a member asking for its parents hears.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Its parent for each stripe.
    Placed(Vec<Parent>),
    /// Its batch is still gathering: ask again by then.
    Wait(Instant),
}

/// Why a member lost its parent for a stripe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loss {
    /// The parent cannot be reached, broke the stream off, or stalled.
    Gone,
    /// The parent sent a piece whose hash is not the holder's: dropped for good, with this reason.
    Corrupt(String),
}

/// Internal reference to a parent: the holder or a member by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Holder,
    Member(usize),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Taking the blob in.
    Active,
    /// Holds all of it.
    Done,
    Gone,
    Dropped(String),
}

#[derive(Clone, Debug)]
struct Member {
    name: String,
    /// Its parent per stripe, once placed.
    parents: Option<Vec<Source>>,
    /// Streams it serves now.
    children: usize,
    state: State,
}

impl Member {
    fn serves(&self) -> bool {
        matches!(self.state, State::Active | State::Done) && self.parents.is_some()
    }
}

/// The batch gathering members: from which member on, and since when.
#[derive(Clone, Copy, Debug)]
struct Batch {
    first: usize,
    opened: Instant,
    /// When its last member joined.
    last: Instant,
}

impl Batch {
    fn due(&self, window: Duration) -> Instant {
        (self.last + BATCH_QUIET).min(self.opened + window)
    }
}

/// One blob's swarm, as the tracker sees it.
#[derive(Clone, Debug)]
pub struct Swarm {
    stripes: usize,
    fan_out: usize,
    /// How many members a batch waits for at most: the nodes the sets land on.
    expected: usize,
    window: Duration,
    /// Every member in the order they asked; one that asks again after it was gone is a new member.
    members: Vec<Member>,
    by_name: HashMap<String, usize>,
    open: Option<Batch>,
    /// Streams the holder serves now.
    holder_children: usize,
}

impl Swarm {
    /// A swarm of a blob cut into `stripes` stripes, where each member serves up to that many children in
    /// its tree, and a batch waits for up to `expected` members (see [`BATCH_QUIET`], [`BATCH_WINDOW`]).
    pub fn new(stripes: usize, expected: usize) -> Swarm {
        Swarm {
            stripes: stripes.max(1),
            fan_out: stripes.max(1),
            expected: expected.max(1),
            window: BATCH_WINDOW,
            members: Vec::new(),
            by_name: HashMap::new(),
            open: None,
            holder_children: 0,
        }
    }

    /// How many members a batch waits for, as the sets change.
    pub fn expect(&mut self, expected: usize) {
        self.expected = expected.max(1);
    }

    /// How many children a member serves in its tree.
    pub fn fan_out(&self) -> usize {
        self.fan_out
    }

    /// `name` asks for its parents: placed at once, or told to ask again. A member that was gone (its
    /// agent restarted) or is done and lost the blob joins anew.
    pub fn join(&mut self, name: &str, now: Instant) -> Placement {
        let known = self.by_name.get(name).copied();
        let rejoins = known.is_none_or(|i| {
            matches!(self.members[i].state, State::Gone | State::Done)
                && self.members[i].parents.is_some()
        });
        let dropped = known.is_some_and(|i| matches!(self.members[i].state, State::Dropped(_)));
        if rejoins && !dropped {
            if let Some(old) = known {
                self.leave(old);
            }
            let index = self.members.len();
            self.members.push(Member {
                name: name.to_string(),
                parents: None,
                children: 0,
                state: State::Active,
            });
            self.by_name.insert(name.to_string(), index);
            self.open
                .get_or_insert(Batch {
                    first: index,
                    opened: now,
                    last: now,
                })
                .last = now;
        }
        self.placement(name, now)
    }

    /// `name`'s parents, closing its batch first if it is due; `Wait` while it gathers. A member the swarm
    /// dropped keeps taking the blob as it did (it checks what it gets as anyone does); it only serves no
    /// one any more.
    pub fn placement(&mut self, name: &str, now: Instant) -> Placement {
        self.close_if_due(now);
        let Some(&index) = self.by_name.get(name) else {
            return Placement::Wait(now);
        };
        match &self.members[index].parents {
            Some(parents) => Placement::Placed(parents.iter().map(|&p| self.parent(p)).collect()),
            None => Placement::Wait(
                self.open
                    .map_or(now, |batch| batch.due(self.window))
                    .max(now),
            ),
        }
    }

    /// `name` lost `from`, its parent for `stripe`, for `why`: the parent is marked (gone, or dropped and
    /// named) and `name` gets another for that stripe. None when `name` is not placed (it asks anew).
    pub fn lost(&mut self, name: &str, stripe: usize, from: &Parent, why: Loss) -> Option<Parent> {
        let &index = self.by_name.get(name)?;
        let current = *self.members[index].parents.as_ref()?.get(stripe)?;
        if self.parent(current) != *from {
            // Another report moved it already.
            return Some(self.parent(current));
        }
        if let Source::Member(parent) = current {
            let member = &mut self.members[parent];
            let was_taking = member.state == State::Active;
            member.state = match why {
                Loss::Gone if matches!(member.state, State::Dropped(_)) => member.state.clone(),
                Loss::Gone => State::Gone,
                Loss::Corrupt(reason) => State::Dropped(reason),
            };
            // A gone member takes nothing more: its parents' streams to it end, and their upload is what
            // its children can have (a dropped one keeps taking the blob).
            if was_taking && member.state == State::Gone {
                for source in member.parents.clone().unwrap_or_default() {
                    self.release(source);
                }
            }
        }
        self.release(current);
        let next = self.least_loaded(stripe, Some(index));
        self.take(next);
        if let Some(parents) = self.members[index].parents.as_mut() {
            parents[stripe] = next;
        }
        Some(self.parent(next))
    }

    /// `name` holds the whole blob: its streams end, and it is the best of parents from now on.
    pub fn done(&mut self, name: &str) {
        let Some(&index) = self.by_name.get(name) else {
            return;
        };
        if self.members[index].state != State::Active {
            return;
        }
        self.members[index].state = State::Done;
        for parent in self.members[index].parents.clone().unwrap_or_default() {
            self.release(parent);
        }
    }

    /// The members dropped for serving corrupt pieces, each with why, in the order they joined.
    pub fn dropped(&self) -> impl Iterator<Item = (&str, &str)> {
        self.members.iter().filter_map(|m| match &m.state {
            State::Dropped(reason) => Some((m.name.as_str(), reason.as_str())),
            _ => None,
        })
    }

    /// Streams `parent` serves now.
    pub fn children(&self, parent: &Parent) -> usize {
        match parent {
            Parent::Holder => self.holder_children,
            Parent::Peer(name) => self
                .by_name
                .get(name)
                .map_or(0, |&i| self.members[i].children),
        }
    }

    /// How many nodes asked, each once.
    pub fn members(&self) -> usize {
        self.by_name.len()
    }

    /// How many hops `name`'s stripe is from the holder (1: the holder is its parent); None when not
    /// placed.
    pub fn depth(&self, name: &str, stripe: usize) -> Option<usize> {
        let mut at = *self.by_name.get(name)?;
        for hops in 1..=self.members.len() + 1 {
            match self.members[at].parents.as_ref()?.get(stripe)? {
                Source::Holder => return Some(hops),
                Source::Member(parent) => at = *parent,
            }
        }
        None
    }

    fn parent(&self, source: Source) -> Parent {
        match source {
            Source::Holder => Parent::Holder,
            Source::Member(i) => Parent::Peer(self.members[i].name.clone()),
        }
    }

    fn take(&mut self, source: Source) {
        match source {
            Source::Holder => self.holder_children += 1,
            Source::Member(i) => self.members[i].children += 1,
        }
    }

    fn release(&mut self, source: Source) {
        let children = match source {
            Source::Holder => &mut self.holder_children,
            Source::Member(i) => &mut self.members[i].children,
        };
        *children = children.saturating_sub(1);
    }

    /// A member replaced by its new self: its streams end; it stays gone as a parent.
    fn leave(&mut self, index: usize) {
        if self.members[index].state == State::Active {
            for parent in self.members[index].parents.clone().unwrap_or_default() {
                self.release(parent);
            }
        }
        self.members[index].state = State::Gone;
    }

    fn close_if_due(&mut self, now: Instant) {
        let Some(batch) = self.open else {
            return;
        };
        let gathered = self.members.len() - batch.first;
        if gathered >= self.expected || now >= batch.due(self.window) {
            self.open = None;
            self.place(batch.first);
        }
    }

    /// Places the batch of members from `first` on: per tree, its group's members as a heap under the tree's
    /// root, the others in the slots left, breadth first.
    fn place(&mut self, first: usize) {
        let batch: Vec<usize> = (first..self.members.len())
            .filter(|&i| self.members[i].state == State::Active)
            .collect();
        let mut trees = Vec::with_capacity(self.stripes);
        for tree in 0..self.stripes {
            // Each member's parent in this tree, by its place in the batch.
            let mut placed = vec![Source::Holder; batch.len()];
            let (forwarding, leaves): (Vec<usize>, Vec<usize>) =
                (0..batch.len()).partition(|at| at % self.stripes == tree);
            let Some(&root) = forwarding.first() else {
                // Too few members for this tree to have its own: each takes the stripe where there is room.
                for at in leaves {
                    let source = self.least_loaded(tree, None);
                    self.take(source);
                    placed[at] = source;
                }
                trees.push(placed);
                continue;
            };
            let source = self.least_loaded(tree, None);
            self.take(source);
            placed[root] = source;
            let mut slots = std::collections::VecDeque::from([(root, self.fan_out)]);
            for &at in forwarding[1..].iter().chain(&leaves) {
                let parent = match slots.front_mut() {
                    Some((parent, free)) => {
                        *free -= 1;
                        let parent = *parent;
                        if slots.front().is_some_and(|(_, free)| *free == 0) {
                            slots.pop_front();
                        }
                        parent
                    }
                    // More leaves than slots (a batch not a multiple of the stripes): one more child for
                    // the forwarding member with the fewest (the deepest of them on a tie), or the holder
                    // when it has fewer.
                    None => {
                        let fewest = *forwarding
                            .iter()
                            .rev()
                            .min_by_key(|&&f| self.members[batch[f]].children)
                            .expect("the tree has a root");
                        if self.members[batch[fewest]].children > self.holder_children {
                            self.take(Source::Holder);
                            placed[at] = Source::Holder;
                            continue;
                        }
                        fewest
                    }
                };
                let source = Source::Member(batch[parent]);
                self.take(source);
                placed[at] = source;
                if at % self.stripes == tree {
                    slots.push_back((at, self.fan_out));
                }
            }
            trees.push(placed);
        }
        for (at, &member) in batch.iter().enumerate() {
            self.members[member].parents = Some(trees.iter().map(|placed| placed[at]).collect());
        }
    }

    /// The least loaded source for `tree` other than `child` and its descendants there: a member placed
    /// before and still serving (one that holds the whole blob first on a tie, then the earliest) unless
    /// the holder is less busy, or the holder when there is none. On a tie a member: the holder's streams
    /// feed whole trees.
    fn least_loaded(&self, tree: usize, child: Option<usize>) -> Source {
        let candidate = self
            .members
            .iter()
            .enumerate()
            .filter(|(i, m)| m.serves() && Some(*i) != child)
            .filter(|(i, m)| {
                m.state == State::Done || child.is_none_or(|c| !self.descends(*i, c, tree))
            })
            .min_by_key(|(i, m)| (m.children, m.state != State::Done, *i));
        match candidate {
            Some((i, m)) if m.children <= self.holder_children => Source::Member(i),
            _ => Source::Holder,
        }
    }

    /// Whether `member`'s bytes of `tree` come through `ancestor`.
    fn descends(&self, member: usize, ancestor: usize, tree: usize) -> bool {
        let mut at = member;
        for _ in 0..=self.members.len() {
            match self.members[at].parents.as_ref().map(|p| p[tree]) {
                Some(Source::Member(parent)) if parent == ancestor => return true,
                Some(Source::Member(parent)) => at = parent,
                _ => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("n{i}")).collect()
    }

    /// A swarm of `n` members that all joined at once, placed.
    fn placed(n: usize, stripes: usize) -> (Swarm, Vec<Vec<Parent>>) {
        let now = Instant::now();
        let mut swarm = Swarm::new(stripes, n);
        let mut placements = Vec::new();
        for name in names(n) {
            placements.push(swarm.join(&name, now));
        }
        let parents = names(n)
            .iter()
            .map(|name| match swarm.placement(name, now) {
                Placement::Placed(parents) => parents,
                other => panic!("{name}: {other:?}"),
            })
            .collect();
        assert!(
            matches!(placements.last(), Some(Placement::Placed(_))),
            "the last expected member closes the batch"
        );
        (swarm, parents)
    }

    #[test]
    fn each_member_forwards_in_one_tree_and_every_tree_is_shallow() {
        for (n, k) in [
            (1, 4),
            (3, 4),
            (7, 4),
            (100, 4),
            (2600, 4),
            (5000, 4),
            (1000, 8),
        ] {
            let (swarm, parents) = placed(n, k);
            let all = names(n);
            // Every stripe of every member comes from somewhere, and the holder serves each tree's root only
            // once there are enough members.
            match n >= k && n % k == 0 {
                true => assert_eq!(swarm.children(&Parent::Holder), k, "{n} members"),
                false => assert!(swarm.children(&Parent::Holder) < 2 * k, "{n} members"),
            }
            for (i, name) in all.iter().enumerate() {
                assert_eq!(parents[i].len(), k);
                for tree in 0..k {
                    let depth = swarm.depth(name, tree).unwrap();
                    let bound = ((n as f64 / k as f64).max(1.0).log(k as f64).ceil() as usize) + 3;
                    assert!(depth <= bound, "{name} tree {tree}: {depth} hops of {n}");
                }
            }
            // A member serves children in its own group's tree only, at most k (one more, rarely, where the
            // leaves outnumber the slots).
            let mut served = vec![vec![0usize; k]; n];
            for member in &parents {
                for (tree, parent) in member.iter().enumerate() {
                    if let Parent::Peer(p) = parent {
                        let at: usize = p[1..].parse().unwrap();
                        served[at][tree] += 1;
                    }
                }
            }
            for (at, trees) in served.iter().enumerate() {
                let busy: Vec<usize> = (0..k).filter(|&t| trees[t] > 0).collect();
                assert!(busy.len() <= 1, "n{at} forwards in {busy:?}");
                assert!(trees.iter().sum::<usize>() <= k + 1, "n{at}: {trees:?}");
            }
        }
    }

    #[test]
    fn a_batch_waits_for_the_expected_members_while_they_keep_coming() {
        let start = Instant::now();
        let mut swarm = Swarm::new(4, 3);
        assert_eq!(swarm.join("a", start), Placement::Wait(start + BATCH_QUIET));
        // b comes just before the quiet gap ends: the batch stays open a gap after b.
        let b_came = start + BATCH_QUIET - Duration::from_millis(1);
        assert_eq!(
            swarm.join("b", b_came),
            Placement::Wait(b_came + BATCH_QUIET)
        );
        assert!(matches!(
            swarm.placement("a", start + BATCH_QUIET),
            Placement::Wait(_)
        ));
        // No third comes: the two are placed.
        let later = b_came + BATCH_QUIET;
        assert!(matches!(swarm.placement("a", later), Placement::Placed(_)));
        let Placement::Placed(b) = swarm.placement("b", later) else {
            panic!()
        };
        assert_eq!(b[0], Parent::Peer("a".into()), "a forwards tree 0 to b");
        assert_eq!(b[1], Parent::Holder, "b is tree 1's root");
        // A latecomer starts a batch of its own, hung from the least loaded members.
        swarm.expect(1);
        let Placement::Placed(c) = swarm.join("c", later) else {
            panic!()
        };
        assert!(c.iter().all(|p| *p != Parent::Peer("c".into())));
        assert_eq!(swarm.members(), 3);
        // Members that keep coming hold a batch open up to its window, no longer.
        let mut swarm = Swarm::new(4, 1000);
        let mut at = start;
        for n in 0..100 {
            at = start + BATCH_QUIET / 2 * n;
            if at >= start + BATCH_WINDOW {
                break;
            }
            assert!(matches!(
                swarm.join(&format!("m{n}"), at),
                Placement::Wait(_)
            ));
        }
        assert!(matches!(swarm.placement("m0", at), Placement::Placed(_)));
    }

    #[test]
    fn a_lost_parent_is_replaced_by_a_member_not_below_the_child() {
        let (mut swarm, parents) = placed(40, 4);
        // n4 forwards tree 0 (its place 4 is group 0) to children; one of them loses it.
        let child = (0..40)
            .find(|&i| parents[i][0] == Parent::Peer("n4".into()))
            .map(|i| format!("n{i}"))
            .unwrap();
        let next = swarm
            .lost(&child, 0, &Parent::Peer("n4".into()), Loss::Gone)
            .unwrap();
        assert_ne!(next, Parent::Peer("n4".into()));
        if let Parent::Peer(name) = &next {
            assert_ne!(*name, child);
            let parent_depth = swarm.depth(name, 0).unwrap();
            assert!(parent_depth < 40, "no cycle through {child}");
        }
        // n4 is gone: nobody gets it again.
        for (i, member) in parents.iter().enumerate() {
            let name = format!("n{i}");
            if member[0] == Parent::Peer("n4".into()) && name != child {
                let next = swarm
                    .lost(&name, 0, &Parent::Peer("n4".into()), Loss::Gone)
                    .unwrap();
                assert_ne!(next, Parent::Peer("n4".into()));
            }
        }
        // A second report of the same loss returns the parent it already has.
        assert_eq!(
            swarm.lost(&child, 0, &Parent::Peer("n4".into()), Loss::Gone),
            Some(next)
        );
    }

    #[test]
    fn a_gone_members_children_go_where_upload_is_spare_never_overloading_a_member() {
        let (mut swarm, parents) = placed(400, 4);
        // n8 and n12 forward tree 0 (places 8 and 12 are group 0) to 4 children each; nearly every
        // member's upload is spoken for, save the upload the two gone members took.
        for gone in ["n8", "n12"] {
            let gone = Parent::Peer(gone.into());
            let children: Vec<usize> = (0..400).filter(|&i| parents[i][0] == gone).collect();
            assert_eq!(children.len(), 4);
            for &child in &children {
                let next = swarm
                    .lost(&format!("n{child}"), 0, &gone, Loss::Gone)
                    .unwrap();
                assert_ne!(
                    next,
                    Parent::Holder,
                    "n{child}: the holder feeds the roots only"
                );
                assert!(
                    swarm.children(&next) <= swarm.fan_out(),
                    "n{child} got {next:?}, which now serves {} streams",
                    swarm.children(&next)
                );
            }
        }
    }

    #[test]
    fn the_holder_sends_each_stripe_once_however_many_nodes() {
        for n in [4, 100, 2600] {
            let (swarm, parents) = placed(n, 4);
            // One stream of each stripe leaves the holder: it sends the blob it fetched once over the
            // link once, and everything else comes from nodes.
            for tree in 0..4 {
                let from_holder = parents.iter().filter(|p| p[tree] == Parent::Holder).count();
                assert_eq!(from_holder, 1, "{n} nodes, stripe {tree}");
            }
            assert_eq!(swarm.children(&Parent::Holder), 4);
        }
    }

    #[test]
    fn a_parent_gone_mid_transfer_costs_a_resume_from_another_not_a_restart() {
        let (mut swarm, parents) = placed(40, 4);
        let geometry = crate::model::peers::Geometry::with(40 << 20, 1 << 20, 4);
        let (child, tree) = (0..40)
            .flat_map(|i| (0..4).map(move |t| (i, t)))
            .find(|&(i, t)| parents[i][t] == Parent::Peer("n4".into()))
            .unwrap();
        let child_name = format!("n{child}");
        // The child had taken the first three pieces of its stripe from n4 when n4 went.
        let mut fetch = crate::model::peers::Fetch::new(geometry);
        for piece in geometry.stripe_from(tree, 0).take(3) {
            fetch.verified(piece);
        }
        let next = swarm
            .lost(&child_name, tree, &Parent::Peer("n4".into()), Loss::Gone)
            .unwrap();
        assert_ne!(next, Parent::Peer("n4".into()));
        assert_ne!(next, Parent::Peer(child_name.clone()));
        // It asks its new parent for the fourth piece of the stripe, keeping what it verified.
        let fourth = geometry.stripe_from(tree, 0).nth(3);
        assert_eq!(fetch.wanted(tree), fourth);
        assert_eq!(fetch.held_bytes(), 3 << 20);
        // n4 is named nowhere as dropped: going away is not serving bad bytes.
        assert_eq!(swarm.dropped().count(), 0);
    }

    #[test]
    fn a_member_that_serves_corrupt_pieces_is_dropped_and_named() {
        let (mut swarm, parents) = placed(12, 4);
        let (child, tree) = (0..12)
            .flat_map(|i| (0..4).map(move |t| (i, t)))
            .find(|&(i, t)| parents[i][t] == Parent::Peer("n1".into()))
            .unwrap();
        let why = "piece 3 of sha256:ab… failed verification".to_string();
        let child = format!("n{child}");
        swarm.lost(
            &child,
            tree,
            &Parent::Peer("n1".into()),
            Loss::Corrupt(why.clone()),
        );
        assert_eq!(swarm.dropped().collect::<Vec<_>>(), [("n1", why.as_str())]);
        // Its other children, reporting it gone, do not clear the reason.
        for (i, member) in parents.iter().enumerate() {
            if member[tree] == Parent::Peer("n1".into()) {
                swarm.lost(
                    &format!("n{i}"),
                    tree,
                    &Parent::Peer("n1".into()),
                    Loss::Gone,
                );
            }
        }
        assert_eq!(swarm.dropped().count(), 1);
        // Nobody gets it as a parent again, and asking again does not clear it.
        swarm.join("n1", Instant::now());
        assert_eq!(swarm.dropped().count(), 1);
        for i in 0..12 {
            for t in 0..4 {
                let name = format!("n{i}");
                if let Placement::Placed(parents) = swarm.placement(&name, Instant::now())
                    && parents[t] == Parent::Peer("n1".into())
                {
                    panic!("{name} still takes stripe {t} from n1 after reporting it");
                }
            }
        }
    }

    #[test]
    fn done_members_are_preferred_parents_and_rejoining_members_start_anew() {
        let (mut swarm, _) = placed(8, 4);
        for name in names(8) {
            swarm.done(&name);
        }
        assert_eq!(swarm.children(&Parent::Holder), 0, "every stream ended");
        swarm.expect(1);
        let Placement::Placed(late) = swarm.join("late", Instant::now()) else {
            panic!()
        };
        assert!(
            late.iter().all(|p| matches!(p, Parent::Peer(_))),
            "{late:?}"
        );
        // n0 restarted with an empty store: it joins again and is a member once.
        swarm.join("n0", Instant::now());
        assert_eq!(swarm.members(), 9);
    }
}
