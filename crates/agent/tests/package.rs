#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The shell and packaging side of the CLI: `hyphae completions` scripts that the shells
//! accept and that complete the real subcommands, `hyphae man`, and the .deb that
//! scripts/package builds (with this test's debug binary: the release build is too slow
//! for the suite), unpacked and checked file by file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_hyphae");

fn run(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (scripts/deps installs it)"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hyphae-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The subcommands every completion script must offer.
const SUBCOMMANDS: &[&str] = &[
    "up",
    "status",
    "join",
    "leave",
    "name",
    "peers",
    "secret",
    "completions",
    "man",
];

#[test]
fn completions_parse_in_their_shells_and_complete_subcommands() {
    let dir = temp_dir("completions");
    for (shell, check) in [("bash", "bash"), ("zsh", "zsh"), ("fish", "fish")] {
        let script = text(&run(BIN, &["completions", shell]));
        let path = dir.join(format!("hyphae.{shell}"));
        std::fs::write(&path, &script).unwrap();
        run(check, &["-n", &path.display().to_string()]);
        for sub in SUBCOMMANDS {
            assert!(script.contains(sub), "{shell} completion lacks {sub}");
        }
    }
    // bash really completes: `hyphae st<TAB>` offers `status`, `hyphae completions <TAB>`
    // offers the shells.
    let bash = dir.join("hyphae.bash").display().to_string();
    let complete = |words: &str| {
        let program = format!(
            "source {bash}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}; \
             _hyphae hyphae \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\""
        );
        text(&run("bash", &["-c", &program]))
    };
    let offered = complete("hyphae st");
    assert_eq!(offered.lines().collect::<Vec<_>>(), ["status"], "{offered}");
    let offered = complete("hyphae completions ''");
    for shell in ["bash", "zsh", "fish"] {
        assert!(offered.lines().any(|l| l == shell), "{offered}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_man_page_renders_with_every_subcommand() {
    let dir = temp_dir("man");
    let page = dir.join("hyphae.1");
    std::fs::write(&page, run(BIN, &["man"]).stdout).unwrap();
    let out = Command::new("man")
        .args(["-l", &page.display().to_string()])
        .env("MANWIDTH", "100")
        .env("MAN_KEEP_FORMATTING", "0")
        .output()
        .expect("man (scripts/deps installs man-db)");
    let rendered = text(&out);
    assert!(
        out.status.success() && rendered.contains("NAME"),
        "{rendered}"
    );
    assert!(
        rendered.contains("hyphae - hyphae: a userspace overlay VPN"),
        "{rendered}"
    );
    for sub in SUBCOMMANDS {
        assert!(
            rendered
                .lines()
                .any(|l| l.trim().starts_with(&format!("hyphae-{sub}"))),
            "no {sub} in\n{rendered}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_deb_holds_the_binary_man_page_completions_and_examples() {
    let dir = temp_dir("deb");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let script = root.join("scripts/package").display().to_string();
    let out_dir = dir.display().to_string();
    let deb = text(&run(&script, &["--binary", BIN, "--out", &out_dir]));
    let deb = deb.trim();
    assert!(deb.ends_with(".deb") && Path::new(deb).is_file(), "{deb}");

    let info = text(&run(
        "dpkg-deb",
        &["--field", deb, "Package", "Version", "Depends"],
    ));
    assert!(info.contains("Package: hyphae"), "{info}");
    assert!(info.contains("Depends: libc6 (>= 2."), "{info}");

    let contents = text(&run("dpkg-deb", &["--contents", deb]));
    let mut wanted = vec![
        "./usr/bin/hyphae",
        "./usr/share/man/man1/hyphae.1.gz",
        "./usr/share/man/man1/hyphae-up.1.gz",
        "./usr/share/man/man1/hyphae-completions.1.gz",
        "./usr/share/bash-completion/completions/hyphae",
        "./usr/share/zsh/vendor-completions/_hyphae",
        "./usr/share/fish/vendor_completions.d/hyphae.fish",
        "./usr/share/doc/hyphae/examples/interface-host.toml",
        "./usr/share/doc/hyphae/copyright",
    ];
    if root.join("dist/hyphae.service").exists() {
        wanted.push("./lib/systemd/system/hyphae.service");
    }
    for path in wanted {
        let line = contents
            .lines()
            .find(|l| l.ends_with(path))
            .unwrap_or_else(|| panic!("{path} not in the package:\n{contents}"));
        assert!(line.contains("root/root"), "{line}");
    }

    // Unpacked, the binary runs and the files are what it generates.
    let unpacked = dir.join("root");
    run("dpkg-deb", &["-x", deb, &unpacked.display().to_string()]);
    let bin = unpacked.join("usr/bin/hyphae").display().to_string();
    let version = text(&run(&bin, &["--version"]));
    assert!(version.starts_with("hyphae "), "{version}");
    let bash =
        std::fs::read_to_string(unpacked.join("usr/share/bash-completion/completions/hyphae"))
            .unwrap();
    assert_eq!(bash, text(&run(BIN, &["completions", "bash"])));
    let man = unpacked
        .join("usr/share/man/man1/hyphae.1.gz")
        .display()
        .to_string();
    assert_eq!(text(&run("zcat", &[&man])), text(&run(BIN, &["man"])));
    let _ = std::fs::remove_dir_all(&dir);
}
