//! What the code under test logs through `tracing`, captured from every thread of the test process. A
//! process has one global subscriber and every suite runs in this one: the first capture installs it, and
//! it writes each event (every target and level) to every capture alive at the time, and to none while
//! there is none. A thread-scoped subscriber would not do: pinboard logs from its runtimes' threads, and
//! callsites other threads registered first stay disabled for it.

use std::io::Write;
use std::sync::{Arc, Mutex, Once};

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::{Layer as _, filter, fmt};

type Buffer = Arc<Mutex<Vec<u8>>>;

/// The buffers of the captures alive.
static CAPTURES: Mutex<Vec<Buffer>> = Mutex::new(Vec::new());

/// Everything logged in this process from its start until it is dropped, including what other tests
/// running meanwhile log.
pub struct LogCapture {
    buffer: Buffer,
}

impl LogCapture {
    pub fn start() -> LogCapture {
        static INSTALL: Once = Once::new();
        INSTALL.call_once(|| {
            let layer = fmt::layer()
                .with_ansi(false)
                .with_writer(|| ToCaptures)
                .with_filter(filter::dynamic_filter_fn(|_, _| {
                    !CAPTURES.lock().unwrap().is_empty()
                }));
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
                .expect("no other global subscriber in the test process");
        });
        let buffer = Buffer::default();
        CAPTURES.lock().unwrap().push(Arc::clone(&buffer));
        LogCapture { buffer }
    }

    /// What was logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.buffer.lock().unwrap()).into_owned()
    }
}

impl Drop for LogCapture {
    fn drop(&mut self) {
        CAPTURES
            .lock()
            .unwrap()
            .retain(|buffer| !Arc::ptr_eq(buffer, &self.buffer));
    }
}

/// The subscriber's writer: appends to every capture alive.
struct ToCaptures;

impl Write for ToCaptures {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        for buffer in CAPTURES.lock().unwrap().iter() {
            buffer.lock().unwrap().extend_from_slice(bytes);
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
