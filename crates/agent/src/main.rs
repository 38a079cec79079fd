//! The `hyphae` command line.
#![allow(clippy::print_stdout)] // the CLI prints its results

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, Result};
use base64::Engine as _;
use clap::{CommandFactory as _, Parser, Subcommand};
use hyphae_agent::{ca, cloud_init, config, control, doctor, join, setup};

/// hyphae: a userspace overlay VPN. One flat private subnet for every member of a namespace.
///
/// `hyphae up` runs the agent (as root, or under the systemd unit): it reads
/// /etc/hyphae/hyphae.toml unless -c names another file, bridges a TAP device per namespace
/// into an encrypted overlay, and finds the other members through a Kademlia DHT. The other
/// commands talk to the running agent over its control socket. The configuration keys are
/// described in the README; examples are in /usr/share/doc/hyphae/examples.
///
/// HYPHAE_LOG sets the log filter (tracing env-filter syntax, default `info`).
#[derive(Parser)]
#[command(name = "hyphae", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the agent in the foreground (needs root).
    Up {
        /// Config file.
        #[arg(short, long, default_value_os_t = setup::default_config_path())]
        config: PathBuf,
    },
    /// Show the running agent's namespaces, members and counters.
    Status {
        /// Config file (for the control socket path).
        #[arg(short, long, default_value_os_t = setup::default_config_path())]
        config: PathBuf,
        /// Print the stable JSON form (docs/CONTROL.md).
        #[arg(long)]
        json: bool,
    },
    /// Join a namespace: add it to the config file and to the running agent (or start the
    /// agent), then wait for this member's address.
    Join(join::JoinArgs),
    /// Leave a namespace: release this member's addresses, remove its device, and take it
    /// out of the config file.
    Leave {
        /// Namespace name.
        namespace: String,
        /// Config file.
        #[arg(short, long, default_value_os_t = setup::default_config_path())]
        config: PathBuf,
    },
    /// Name this member in a namespace's virtual DNS (`NAME.NAMESPACE`).
    #[command(subcommand)]
    Name(NameCmd),
    /// List the members of every namespace: virtual addresses, path (direct or relayed,
    /// and through whom) and round-trip time.
    Peers {
        /// Config file (for the control socket path).
        #[arg(short, long, default_value_os_t = setup::default_config_path())]
        config: PathBuf,
        /// Print JSON: `{"namespaces": [{"name", "address", "peers": [...]}]}` with the
        /// peer objects of `hyphae status --json`.
        #[arg(long)]
        json: bool,
    },
    /// Print a new random namespace secret (base64 of 32 bytes).
    Secret,
    /// Print this host's identity (creating it if there is none yet): what a namespace
    /// authority signs a certificate for.
    Id {
        /// Config file (for the state directory).
        #[arg(short, long, default_value_os_t = setup::default_config_path())]
        config: PathBuf,
    },
    /// A namespace authority: the key that signs members' certificates.
    #[command(subcommand)]
    Ca(CaCmd),
    /// A namespace's policy (docs/POLICY.md): check a flow against it, and with an
    /// authority sign and publish it.
    #[command(subcommand)]
    Policy(PolicyCmd),
    /// Member certificates and revocation lists.
    #[command(subcommand)]
    Cert(CertCmd),
    /// Print `#cloud-config` user-data that installs hyphae on a new VM, writes its config
    /// and the namespace secret (0600), and starts it, joining the namespace on first boot.
    CloudInit(Box<cloud_init::CloudInitArgs>),
    /// Check this host for what the agent needs, one line per check with a fix for each
    /// failure; exit status 0 only when none failed.
    Doctor {
        /// Config file.
        #[arg(short, long, default_value_os_t = setup::default_config_path())]
        config: PathBuf,
    },
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), generated from these commands: `hyphae man | man -l -`.
    Man {
        /// Write every page instead (hyphae.1 and one per subcommand, hyphae-up.1, ...)
        /// into this directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum NameCmd {
    /// Claim NAME for this member's own address in NAMESPACE (kept in the config file as
    /// `hostname`); refused if another member holds it.
    Set {
        /// Namespace name.
        namespace: String,
        /// Host name: letters, digits and inner '-'.
        name: String,
        /// Config file.
        #[arg(short, long, default_value_os_t = setup::default_config_path())]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum CaCmd {
    /// Write a new authority key for NAMESPACE (0600; keep it offline) and print the
    /// `authority = "..."` line every member's config needs.
    Init {
        /// Namespace name.
        namespace: String,
        /// Where to write the key (default NAMESPACE.ca.key).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Give a revocation list (`hyphae cert revoke`) to the running agent, which passes it
    /// to every member of NAMESPACE within seconds; the members it revokes are cut off.
    Publish {
        /// Namespace name.
        namespace: String,
        /// The revocation list file.
        file: PathBuf,
        /// Config file (for the control socket path).
        #[arg(short, long, default_value_os_t = setup::default_config_path())]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum PolicyCmd {
    /// Ask the running agent what NAMESPACE's policy says of a flow, and why: the rule
    /// that allows it, or the default. Exit status 0 when allowed, 1 when denied.
    Check {
        /// Namespace name.
        namespace: String,
        /// Who opens the flow: an address, or a member's certificate name.
        #[arg(long)]
        from: String,
        /// To whom: an address, or a member's certificate name.
        #[arg(long)]
        to: String,
        /// What: tcp/PORT, udp/PORT or icmp.
        traffic: String,
        /// Config file (for the control socket path).
        #[arg(short, long, default_value_os_t = setup::default_config_path())]
        config: PathBuf,
    },
    /// Sign a policy file (TOML) with a namespace's authority key, as the version the file
    /// gives (`version = N`), after checking it. Done where the key is, offline.
    Sign {
        /// The authority key file (`hyphae ca init`).
        #[arg(long)]
        ca: PathBuf,
        /// The policy file.
        file: PathBuf,
        /// Where to write the signed policy (default: FILE with extension .policy).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Give a signed policy (`hyphae policy sign`) to the running agent: it is in force
    /// there at once and every member of NAMESPACE takes it within seconds. An older or
    /// equal version is refused (no rollback).
    Publish {
        /// Namespace name.
        namespace: String,
        /// The signed policy file.
        file: PathBuf,
        /// Config file (for the control socket path).
        #[arg(short, long, default_value_os_t = setup::default_config_path())]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum CertCmd {
    /// Sign a certificate binding a member's identity to a name, groups and, optionally,
    /// the addresses it may claim.
    Sign(ca::SignArgs),
    /// Print a certificate, revocation list or signed policy and check its signature.
    Show {
        /// The file.
        file: PathBuf,
    },
    /// Write the next revocation list: revoke identities or certificates.
    Revoke(ca::RevokeArgs),
    /// Put a renewed certificate in place of NAMESPACE's (the config's `certificate`
    /// file) after checking it, and have the running agent switch to it without dropping
    /// a tunnel (as SIGHUP does).
    Install {
        /// The namespace.
        namespace: String,
        /// The new certificate.
        file: PathBuf,
        /// Config file.
        #[arg(short, long, default_value_os_t = setup::default_config_path())]
        config: PathBuf,
    },
}

/// Sends `request` to the agent of config file `config` and returns its JSON reply; the
/// agent's `error`, if any, is this command's.
fn ask(config: &std::path::Path, request: &control::Request) -> anyhow::Result<serde_json::Value> {
    let socket = config::control_socket(config)?;
    let v: serde_json::Value = serde_json::from_str(&control::request(&socket, request)?)?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        anyhow::bail!("{e}");
    }
    Ok(v)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HYPHAE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match execute(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hyphae: error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}

fn execute(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Up { config } => hyphae_agent::up(config::Config::load(&config)?),
        Cmd::Status { config, json } => {
            let socket = config::control_socket(&config)?;
            let reply = control::request(&socket, &control::Request::Status)?;
            if json {
                print!("{reply}");
            } else {
                let status: control::Status = serde_json::from_str(&reply)?;
                print!("{}", control::render(&status));
            }
            Ok(())
        }
        Cmd::Join(args) => join::join(&args),
        Cmd::Leave { namespace, config } => join::leave(&namespace, &config),
        Cmd::Name(NameCmd::Set {
            namespace,
            name,
            config,
        }) => join::set_name(&namespace, &name, &config),
        Cmd::Peers { config, json } => {
            let socket = config::control_socket(&config)?;
            let reply = control::request(&socket, &control::Request::Status)?;
            let status: control::Status = serde_json::from_str(&reply)?;
            if json {
                println!("{}", control::peers_json(&status));
            } else {
                print!("{}", control::render_peers(&status));
            }
            Ok(())
        }
        Cmd::CloudInit(args) => cloud_init::print(&args),
        Cmd::Doctor { config } => doctor::run(&config),
        Cmd::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "hyphae", &mut std::io::stdout());
            Ok(())
        }
        // Without `help`, as clap_mangen::generate_to leaves it out of the pages it writes.
        Cmd::Man { dir: None } => {
            clap_mangen::Man::new(Cli::command().disable_help_subcommand(true))
                .render(&mut std::io::stdout())
                .context("writing the manual page")
        }
        Cmd::Man { dir: Some(dir) } => clap_mangen::generate_to(Cli::command(), &dir)
            .with_context(|| format!("writing the manual pages to {}", dir.display())),
        Cmd::Id { config } => {
            let state = config::state_dir(&config)?;
            let identity = setup::load_or_create_identity(&state)?;
            println!("{}", identity.peer_id());
            Ok(())
        }
        Cmd::Ca(CaCmd::Init { namespace, out }) => {
            println!("{}", ca::init(&namespace, out)?);
            Ok(())
        }
        Cmd::Ca(CaCmd::Publish {
            namespace,
            file,
            config,
        }) => {
            let list = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let v = ask(
                &config,
                &control::Request::Revocations {
                    namespace: namespace.clone(),
                    list,
                },
            )?;
            println!(
                "revocation list version {} published in '{namespace}'",
                v.get("version")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0)
            );
            Ok(())
        }
        Cmd::Policy(PolicyCmd::Sign { ca: key, file, out }) => {
            print!("{}", ca::sign_policy(&key, &file, out)?);
            Ok(())
        }
        Cmd::Policy(PolicyCmd::Publish {
            namespace,
            file,
            config,
        }) => {
            let policy = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let v = ask(
                &config,
                &control::Request::PolicyPublish {
                    namespace: namespace.clone(),
                    policy,
                },
            )?;
            println!(
                "policy version {} in force here and published in '{namespace}'",
                v.get("version")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0)
            );
            Ok(())
        }
        Cmd::Policy(PolicyCmd::Check {
            namespace,
            from,
            to,
            traffic,
            config,
        }) => {
            let v = ask(
                &config,
                &control::Request::PolicyCheck {
                    namespace,
                    from,
                    to,
                    traffic,
                },
            )?;
            println!("{}", v["message"].as_str().unwrap_or_default());
            if v["allowed"].as_bool() != Some(true) {
                std::process::exit(1);
            }
            Ok(())
        }
        Cmd::Cert(CertCmd::Sign(args)) => {
            print!("{}", ca::sign(&args)?);
            Ok(())
        }
        Cmd::Cert(CertCmd::Show { file }) => {
            print!("{}", ca::show(&file)?);
            Ok(())
        }
        Cmd::Cert(CertCmd::Install {
            namespace,
            file,
            config,
        }) => {
            println!("{}", ca::install(&namespace, &file, &config)?);
            Ok(())
        }
        Cmd::Cert(CertCmd::Revoke(args)) => {
            println!("{}", ca::revoke(&args)?);
            Ok(())
        }
        Cmd::Secret => {
            let secret = hyphae_agent::setup::os_seed()?;
            println!(
                "{}",
                base64::engine::general_purpose::STANDARD.encode(secret)
            );
            Ok(())
        }
    }
}
