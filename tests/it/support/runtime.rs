//! The runtimes a lab node runs (docs/lab.md, "The runtimes"): containerd 1.6 (Debian bookworm's, the
//! machine's own package), containerd 1.7 and 2.1 (Debian trixie's and sid's, fetched by scripts/setup into
//! `<cache>/runtimes/`) and a real CRI-O 1.33 (built there by scripts/setup from `../shared/vendor`).
//!
//! A lab without kubelets runs containerd 2.1, what a new cluster runs; a cluster lab's nodes run 1.7, as
//! the lab's kubelet 1.20 speaks only CRI v1alpha2, which containerd 2 removed. `PINBOARD_LAB_RUNTIME`
//! (`containerd-1.6`, `containerd-1.7`, `containerd-2.1`, `crio-1.33`) gives every lab node without a
//! runtime of its own another one, to run a suite on it.

use std::fmt;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};

use super::apiserver::cache_dir;

/// The environment variable that chooses the runtime of every node that does not name its own.
pub const RUNTIME_ENV: &str = "PINBOARD_LAB_RUNTIME";

/// One runtime of the lab's matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Runtime {
    /// Debian bookworm's containerd 1.6.20: no CRI `pinned`.
    Containerd16,
    /// Debian trixie's containerd 1.7: CRI `pinned`, CRI v1alpha2 still served (the lab's kubelet).
    Containerd17,
    /// Debian sid's containerd 2.1: config version 3, no CRI v1alpha2.
    Containerd21,
    /// CRI-O 1.33 built from its source tarball, as OpenShift 4.20 runs it.
    Crio133,
}

impl Runtime {
    /// Every runtime of the matrix, oldest containerd first.
    pub const ALL: [Runtime; 4] = [
        Runtime::Containerd16,
        Runtime::Containerd17,
        Runtime::Containerd21,
        Runtime::Crio133,
    ];

    /// What a lab node runs when its spec names no runtime: [`RUNTIME_ENV`], else containerd 2.1 (1.7 in
    /// a cluster lab, whose kubelet needs CRI v1alpha2).
    pub fn default_for(cluster: bool) -> Result<Runtime> {
        match std::env::var(RUNTIME_ENV) {
            Ok(name) if !name.is_empty() => name.parse(),
            _ if cluster => Ok(Runtime::Containerd17),
            _ => Ok(Runtime::Containerd21),
        }
    }

    /// `containerd-2.1`, `crio-1.33`: as test names and logs say it.
    pub fn label(self) -> &'static str {
        match self {
            Runtime::Containerd16 => "containerd-1.6",
            Runtime::Containerd17 => "containerd-1.7",
            Runtime::Containerd21 => "containerd-2.1",
            Runtime::Crio133 => "crio-1.33",
        }
    }

    pub fn is_crio(self) -> bool {
        self == Runtime::Crio133
    }

    /// Whether it serves CRI `runtime.v1alpha2`, the only CRI the lab's kubelet 1.20 speaks.
    pub fn serves_kubelet_1_20(self) -> bool {
        matches!(self, Runtime::Containerd16 | Runtime::Containerd17)
    }

    /// Whether it reports CRI `Image.pinned` (containerd from 1.6.22 / 1.7.3, CRI-O from 1.28).
    pub fn reports_pinned(self) -> bool {
        self != Runtime::Containerd16
    }

    /// The containerd config version its nodes are written in: 3 for containerd 2, as a new node has it.
    pub fn containerd_config_version(self) -> u32 {
        match self {
            Runtime::Containerd21 => 3,
            _ => 2,
        }
    }

    /// Where its programs are (`containerd`, its shim and `ctr`; `crio` and `pinns`); None for the
    /// machine's own containerd, on PATH. An error naming the fix when scripts/setup has not put them there.
    pub fn bin_dir(self) -> Result<Option<PathBuf>> {
        let (dir, program) = match self {
            Runtime::Containerd16 => return Ok(None),
            Runtime::Containerd17 => ("containerd-1.7/usr/bin", "containerd"),
            Runtime::Containerd21 => ("containerd-2.1/usr/bin", "containerd"),
            Runtime::Crio133 => ("crio-1.33/bin", "crio"),
        };
        let dir = cache_dir().join("runtimes").join(dir);
        if !dir.join(program).is_file() {
            if self.is_crio() {
                bail!(
                    "the real CRI-O is not built ({} is missing): scripts/setup builds it from \
                     ../shared/vendor/cri-o-v1.33.13.tar.xz; without that tarball its tests are skipped \
                     (scripts/test passes --skip {CRIO_TEST_MARK})",
                    dir.join(program).display()
                );
            }
            bail!(
                "{} is missing: run scripts/setup, which fetches {} from Debian's archive",
                dir.join(program).display(),
                self.label()
            );
        }
        Ok(Some(dir))
    }

    /// The full path of its program `name` (`containerd`, `ctr`, `crio`, …).
    pub fn program(self, name: &str) -> Result<PathBuf> {
        Ok(self
            .bin_dir()?
            .map_or_else(|| PathBuf::from(name), |dir| dir.join(name)))
    }

    /// `PATH` for its processes: its own programs first (containerd starts its shim from `PATH`).
    pub fn path_env(self) -> Result<std::ffi::OsString> {
        let system = std::env::var_os("PATH").unwrap_or_default();
        let Some(dir) = self.bin_dir()? else {
            return Ok(system);
        };
        std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(&system)))
            .context("PATH")
    }
}

/// What the names of the tests of the real CRI-O contain, so that scripts/test can skip them (`--skip`)
/// on a machine without its source tarball.
pub const CRIO_TEST_MARK: &str = "crio_1_33";

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

impl std::str::FromStr for Runtime {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> Result<Runtime> {
        Runtime::ALL
            .into_iter()
            .find(|r| r.label() == text)
            .with_context(|| {
                let known: Vec<&str> = Runtime::ALL.iter().map(|r| r.label()).collect();
                format!(
                    "{RUNTIME_ENV}={text}: not a lab runtime; use one of {}",
                    known.join(", ")
                )
            })
    }
}

/// The contract, as containerd's own metrics count the gRPC calls it answered (`answered`, by call and
/// code; [`super::Node::grpc_calls`]): each of `calls` answered OK at least once, and none of them with an
/// error that says the request was wrong or broke the runtime.
pub fn assert_answered(
    runtime: Runtime,
    calls: &[&str],
    answered: &std::collections::BTreeMap<(String, String), f64>,
) {
    for call in calls {
        let ok = answered
            .get(&(call.to_string(), "OK".to_string()))
            .copied()
            .unwrap_or(0.0);
        assert!(ok > 0.0, "{runtime} never answered {call} OK: {answered:?}");
    }
    let broken: Vec<_> = answered
        .iter()
        .filter(|((call, code), count)| {
            **count > 0.0
                && calls.contains(&call.as_str())
                && ["Unknown", "Internal", "InvalidArgument", "Unimplemented"]
                    .contains(&code.as_str())
        })
        .collect();
    assert!(
        broken.is_empty(),
        "{runtime} refused or broke on: {broken:?}"
    );
}

impl Runtime {
    /// The runtime a matrix test of that name runs on: `crio_1_33` is [`Runtime::Crio133`].
    pub fn of_test(name: &str) -> Runtime {
        Runtime::ALL
            .into_iter()
            .find(|r| r.label().replace(['-', '.'], "_") == name)
            .unwrap_or_else(|| panic!("{name} names no lab runtime"))
    }
}

/// A test run once per runtime: `on_runtimes!(/// doc [containerd_1_6, crio_1_33] fn name(runtime) { … })`
/// makes the module `name` with one test per runtime listed (its name says which), each calling the body
/// with its [`Runtime`]. `on_every_runtime!` lists them all.
#[macro_export]
macro_rules! on_runtimes {
    ($(#[$meta:meta])* [$($test:ident),+ $(,)?] fn $name:ident($runtime:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn run($runtime: $crate::support::Runtime) {
                eprintln!("runtime: {}", $runtime);
                $body
            }

            $(
                #[test]
                fn $test() {
                    run($crate::support::Runtime::of_test(stringify!($test)))
                }
            )+
        }
    };
}

/// [`on_runtimes!`] on every runtime of the matrix.
#[macro_export]
macro_rules! on_every_runtime {
    ($(#[$meta:meta])* fn $name:ident($runtime:ident) $body:block) => {
        $crate::on_runtimes!(
            $(#[$meta])* [containerd_1_6, containerd_1_7, containerd_2_1, crio_1_33]
            fn $name($runtime) $body
        );
    };
}
