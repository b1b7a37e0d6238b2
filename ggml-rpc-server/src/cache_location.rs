//! Where `-c` puts the tensor cache: the reference's `fs_get_cache_directory()` + `rpc`.

use std::path::PathBuf;

/// The reference's cache directory for `rpc-server -c`, from the environment:
/// `$LLAMA_CACHE/rpc`; otherwise on Linux and other Unix `$XDG_CACHE_HOME/llama.cpp/rpc` or
/// `$HOME/.cache/llama.cpp/rpc`, on macOS `~/Library/Caches/llama.cpp/rpc`, on Windows
/// `%LOCALAPPDATA%\llama.cpp\rpc`. `None` when none of the variables is set.
pub fn default_cache_dir(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |name: &str| {
        env(name)
            .filter(|value| !value.is_empty())
            .map(PathBuf::from)
    };
    let root = if let Some(dir) = set("LLAMA_CACHE") {
        dir
    } else if cfg!(windows) {
        set("LOCALAPPDATA")?.join("llama.cpp")
    } else if cfg!(target_os = "macos") {
        set("HOME")?
            .join("Library")
            .join("Caches")
            .join("llama.cpp")
    } else if let Some(xdg) = set("XDG_CACHE_HOME") {
        xdg.join("llama.cpp")
    } else {
        set("HOME")?.join(".cache").join("llama.cpp")
    };
    Some(root.join("rpc"))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn follows_the_reference_order() {
        let all = [
            ("LLAMA_CACHE", "/l"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(default_cache_dir(env(&all)), Some(PathBuf::from("/l/rpc")));
        assert_eq!(
            default_cache_dir(env(&all[1..])),
            Some(PathBuf::from("/x/llama.cpp/rpc"))
        );
        assert_eq!(
            default_cache_dir(env(&all[2..])),
            Some(PathBuf::from("/h/.cache/llama.cpp/rpc"))
        );
        assert_eq!(
            default_cache_dir(env(&[("LLAMA_CACHE", ""), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/llama.cpp/rpc"))
        );
        assert_eq!(default_cache_dir(env(&[])), None);
    }
}
