//! Writing a component's result directory: `windows.jsonl` (one record per
//! line, flushed every window), `summary.json` (at the end) and, for a
//! middleware, `trace.csv` (sampled requests with all their timestamps).

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::record::WindowRecord;

/// The column header of trace.csv.
pub const TRACE_HEADER: &str =
    "request_id,op,keys,worker,t_recv,t_parsed,t_enqueue,t_dequeue,t_send,t_backend_done,t_reply,servers,status";

/// One sampled request of trace.csv; times in ns on the process's monotonic clock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceRow {
    /// Unique per process.
    pub request_id: u64,
    /// Operation class name.
    pub op: &'static str,
    /// Keys requested.
    pub keys: u32,
    /// Worker that processed it.
    pub worker: u32,
    /// Request bytes read.
    pub t_recv: u64,
    /// Request parsed.
    pub t_parsed: u64,
    /// Put on the request queue.
    pub t_enqueue: u64,
    /// Taken by a worker.
    pub t_dequeue: u64,
    /// First sub-request sent to a server (= t_dequeue when no server was involved).
    pub t_send: u64,
    /// Last server reply parsed.
    pub t_backend_done: u64,
    /// Reply handed to the client socket.
    pub t_reply: u64,
    /// Servers involved.
    pub servers: u32,
    /// `ok`, `error`, `client_error` or `server_error`.
    pub status: &'static str,
}

impl TraceRow {
    fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        writeln!(
            w,
            "{},{},{},{},{},{},{},{},{},{},{},{},{}",
            self.request_id,
            self.op,
            self.keys,
            self.worker,
            self.t_recv,
            self.t_parsed,
            self.t_enqueue,
            self.t_dequeue,
            self.t_send,
            self.t_backend_done,
            self.t_reply,
            self.servers,
            self.status
        )
    }
}

/// The open files of a result directory.
pub struct ResultsWriter {
    dir: PathBuf,
    windows: BufWriter<File>,
    trace: Option<BufWriter<File>>,
}

impl ResultsWriter {
    /// Creates `dir` (and parents) and its files; `trace` adds trace.csv.
    pub fn create(dir: &Path, trace: bool) -> io::Result<ResultsWriter> {
        fs::create_dir_all(dir)?;
        let windows = BufWriter::new(File::create(dir.join("windows.jsonl"))?);
        let trace = if trace {
            let mut t = BufWriter::new(File::create(dir.join("trace.csv"))?);
            writeln!(t, "{TRACE_HEADER}")?;
            Some(t)
        } else {
            None
        };
        Ok(ResultsWriter { dir: dir.to_path_buf(), windows, trace })
    }

    /// Appends a window and flushes it to the file.
    pub fn window(&mut self, record: &WindowRecord) -> io::Result<()> {
        serde_json::to_writer(&mut self.windows, record)?;
        self.windows.write_all(b"\n")?;
        self.windows.flush()
    }

    /// Appends sampled requests (flushed with the next window or at the end).
    pub fn trace(&mut self, rows: &[TraceRow]) -> io::Result<()> {
        if let Some(t) = &mut self.trace {
            for r in rows {
                r.write_to(t)?;
            }
            t.flush()?;
        }
        Ok(())
    }

    /// Writes summary.json (atomically: a temporary file renamed into place).
    pub fn summary(&mut self, record: &WindowRecord) -> io::Result<()> {
        let tmp = self.dir.join("summary.json.tmp");
        let mut f = BufWriter::new(File::create(&tmp)?);
        serde_json::to_writer_pretty(&mut f, record)?;
        f.write_all(b"\n")?;
        f.flush()?;
        drop(f);
        fs::rename(tmp, self.dir.join("summary.json"))
    }
}
