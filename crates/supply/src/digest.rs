//! Streaming file digests in the two forms the Hugging Face Hub publishes: SHA-256 for LFS files
//! and the git blob SHA-1 (`sha1("blob <size>\0" + bytes)`) for everything else.
//!
//! Files are read once, in large blocks, so verifying a checkpoint costs about what reading it
//! costs; sha2 and sha1 pick the CPU's SHA extensions at run time where present.

use serde::{Deserialize, Serialize};
use sha1::Sha1;
use sha2::{Digest as _, Sha256};
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Which digest a pin uses for a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// SHA-256 of the content (the Hub's LFS pointer digest).
    Sha256,
    /// Git blob SHA-1 of the content (the Hub's digest for non-LFS files).
    GitSha1,
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "sha256",
            Algorithm::GitSha1 => "git-sha1",
        }
    }

    pub(crate) fn hex_len(self) -> usize {
        match self {
            Algorithm::Sha256 => 64,
            Algorithm::GitSha1 => 40,
        }
    }
}

/// Read block size: large enough that syscalls vanish next to hashing.
const BLOCK: usize = 4 << 20;

/// Size in bytes and hex digest of a file, read in one streaming pass.
pub fn file_digest(path: &Path, algo: Algorithm) -> io::Result<(u64, String)> {
    let mut file = File::open(path)?;
    let size = file.metadata()?.len();
    let hex = match algo {
        Algorithm::Sha256 => {
            let mut h = Sha256::new();
            let read = pump(&mut file, BLOCK, |b| h.update(b))?;
            check_len(path, size, read)?;
            source_hash::hex(&h.finalize())
        }
        Algorithm::GitSha1 => {
            let mut h = Sha1::new();
            h.update(format!("blob {size}\0").as_bytes());
            let read = pump(&mut file, BLOCK, |b| h.update(b))?;
            check_len(path, size, read)?;
            source_hash::hex(&h.finalize())
        }
    };
    Ok((size, hex))
}

/// Digest of bytes in memory (for generated files and tests).
pub fn bytes_digest(bytes: &[u8], algo: Algorithm) -> String {
    match algo {
        Algorithm::Sha256 => source_hash::hex(&Sha256::digest(bytes)),
        Algorithm::GitSha1 => {
            let mut h = Sha1::new();
            h.update(format!("blob {}\0", bytes.len()).as_bytes());
            h.update(bytes);
            source_hash::hex(&h.finalize())
        }
    }
}

/// Feeds the file to `sink` block by block. A reader thread keeps the next blocks coming while
/// this one hashes, so a cold read and the hashing overlap: verifying costs about the slower of
/// the two, not their sum.
fn pump(file: &mut File, block: usize, mut sink: impl FnMut(&[u8])) -> io::Result<u64> {
    let (full_tx, full_rx) = std::sync::mpsc::sync_channel::<io::Result<Vec<u8>>>(2);
    let (empty_tx, empty_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::scope(|scope| {
        scope.spawn(move || loop {
            let mut chunk = empty_rx.try_recv().unwrap_or_else(|_| vec![0u8; block]);
            chunk.resize(block, 0);
            let mut filled = 0;
            while filled < block {
                match file.read(&mut chunk[filled..]) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        let _ = full_tx.send(Err(e));
                        return;
                    }
                }
            }
            chunk.truncate(filled);
            if filled == 0 || full_tx.send(Ok(chunk)).is_err() {
                return;
            }
        });
        let mut total = 0u64;
        for chunk in full_rx {
            let chunk = chunk?;
            sink(&chunk);
            total += chunk.len() as u64;
            let _ = empty_tx.send(chunk);
        }
        Ok(total)
    })
}

/// A file that changes size while we hash it would give a digest of neither version.
fn check_len(path: &Path, expected: u64, read: u64) -> io::Result<()> {
    if expected == read {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{} changed size while being read ({expected} then {read} bytes)",
            path.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_blob_sha1_matches_git() {
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(bytes_digest(b"hello\n", Algorithm::GitSha1), "ce013625030ba8dba906f756967f9e9ca394464a");
        // The empty blob, a well-known constant.
        assert_eq!(bytes_digest(b"", Algorithm::GitSha1), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
    }

    #[test]
    fn sha256_matches_known_vector() {
        assert_eq!(
            bytes_digest(b"abc", Algorithm::Sha256),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn file_digest_equals_bytes_digest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..(BLOCK + 17)).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        for algo in [Algorithm::Sha256, Algorithm::GitSha1] {
            let (size, hex) = file_digest(&path, algo).unwrap();
            assert_eq!(size, bytes.len() as u64);
            assert_eq!(hex, bytes_digest(&bytes, algo));
        }
    }
}
