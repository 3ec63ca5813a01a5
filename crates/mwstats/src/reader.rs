//! Reading a result directory back, refusing anything damaged: a line of
//! windows.jsonl that is not a complete record is an error naming the file and
//! line, never skipped.

use std::path::Path;

use crate::record::{WindowRecord, FORMAT};

/// A result file that cannot be read as the results format.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A line or file is not a valid record.
    #[error("{path}:{line}: {why}")]
    Bad {
        /// The file.
        path: String,
        /// 1-based line number (0 for a whole file).
        line: usize,
        /// What is wrong.
        why: String,
    },
}

fn parse_record(text: &str, path: &str, line: usize) -> Result<WindowRecord, ReadError> {
    let bad = |why: String| ReadError::Bad { path: path.to_string(), line, why };
    let r: WindowRecord = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    if r.format != FORMAT {
        return Err(bad(format!("format is {:?}, this reader knows {FORMAT:?}", r.format)));
    }
    Ok(r)
}

/// Reads every window of `dir/windows.jsonl`. The file must end with a newline
/// (a last line without one is a truncated write).
pub fn read_windows(dir: &Path) -> Result<Vec<WindowRecord>, ReadError> {
    let path = dir.join("windows.jsonl");
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|source| ReadError::Io { path: shown.clone(), source })?;
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if !line.ends_with('\n') {
            return Err(ReadError::Bad { path: shown, line: i + 1, why: "truncated line (no newline at end)".into() });
        }
        out.push(parse_record(line.trim_end(), &shown, i + 1)?);
    }
    Ok(out)
}

/// Reads `dir/summary.json`.
pub fn read_summary(dir: &Path) -> Result<WindowRecord, ReadError> {
    let path = dir.join("summary.json");
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|source| ReadError::Io { path: shown.clone(), source })?;
    parse_record(&text, &shown, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::WindowRecord;
    use crate::writer::ResultsWriter;

    fn dir(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("mwstats-reader-{name}-{}", std::process::id()))
    }

    #[test]
    fn round_trip_and_damaged_lines() {
        let d = dir("rt");
        let mut w = ResultsWriter::create(&d, false).unwrap();
        let rec = WindowRecord { format: FORMAT.into(), source: "test".into(), window: Some(3), ..Default::default() };
        w.window(&rec).unwrap();
        w.window(&rec).unwrap();
        w.summary(&rec).unwrap();
        assert_eq!(read_windows(&d).unwrap().len(), 2);
        assert_eq!(read_summary(&d).unwrap().window, Some(3));
        let path = d.join("windows.jsonl");
        let good = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{good}{{\"format\": \"mwlab/1\", \"sou")).unwrap();
        let e = read_windows(&d).unwrap_err().to_string();
        assert!(e.contains(":3:") && e.contains("truncated"), "{e}");
        std::fs::write(&path, format!("{good}garbage\n")).unwrap();
        let e = read_windows(&d).unwrap_err().to_string();
        assert!(e.contains(":3:"), "{e}");
        std::fs::write(&path, good.replace("mwlab/1", "mwlab/9")).unwrap();
        assert!(read_windows(&d).unwrap_err().to_string().contains("mwlab/9"));
        std::fs::remove_dir_all(&d).ok();
    }
}
