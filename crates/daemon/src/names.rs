//! Names and ids that come from requests (function names, invocation and session ids)
//! are checked against one strict character set ([`skiff_manifest::is_name`]): at the
//! edge, for every route's path parameters, and again wherever one becomes a file name,
//! so no path the daemon builds from input leaves its directory.

use std::path::{Path, PathBuf};

/// `Ok` when `text` is a valid name; else the message a 400 carries.
pub fn check(kind: &str, text: &str) -> Result<(), String> {
    if skiff_manifest::is_name(text) {
        return Ok(());
    }
    let shown: String = text.chars().take(80).collect();
    Err(format!(
        "invalid {kind} {shown:?}: use 1-63 lowercase letters, digits and dashes, starting with a letter or digit"
    ))
}

/// `dir/NAME` followed by `suffix`, refused unless `name` is a valid name.
pub fn inside(dir: &Path, name: &str, suffix: &str) -> std::io::Result<PathBuf> {
    check("name", name).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    Ok(dir.join(format!("{name}{suffix}")))
}
