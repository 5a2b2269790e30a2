"""The V-trace apps' command-line pre-check: one line, exit status 2, for a command line that
cannot work (an override naming no key, a value of the wrong type, an option a config group
lacks, a misused Hydra flag), where Hydra would print many lines or a traceback. Hydra's own
flags are read with Hydra's own parser, so every form Hydra documents passes as it is.

    sys.argv[1:] = check_command_line("experiment", ExperimentConfig)   # before hydra.main
"""

import os
import sys
import typing

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.config_repository import CachingConfigRepository
from hydra._internal.defaults_list import create_defaults_list
from hydra._internal.utils import (
    compute_search_path_dir,
    create_config_search_path,
    get_args_parser,
)
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from examples.vtrace.config import CONFIG_DIR, POSITIVE_INTEGERS, POSITIVE_NUMBERS

# Both apps (experiment.py, evaluate.py) lie beside config.py with @hydra.main(config_path=".").
APP_CONFIG_PATH = "."
_MISSING = object()


def check_command_line(
    program, schema, positive=POSITIVE_INTEGERS + POSITIVE_NUMBERS, argv=None, config_name="config"
):
    """Exit with one line when the command line cannot work: an override that names no key
    (batchsize=8), a value that does not fit its key's type (batch_size=ten), an option that a
    config group lacks (preset=nosuchpreset), or a misused Hydra flag; Hydra would say so in many
    lines or with a traceback. Hydra's flags are read with Hydra's own parser, so every form that
    Hydra takes (--cfg job, -c job, --info, -cn NAME, ...) passes as it is.

    `config_name` is the app's @hydra.main(config_name=...). Returns the arguments to hand on to
    Hydra as sys.argv[1:]."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_hydra_flags(program, argv)
    if args.experimental_rerun is not None:
        return argv  # Hydra reruns a stored config and ignores the overrides
    if args.shell_completion:
        check_shell_completion(program, args.overrides)  # its arguments are no overrides
        return argv
    parser = OverridesParser.create()
    overrides = [(arg, parse_override(program, parser, arg)) for arg in args.overrides]
    primary = args.config_name or config_name
    repo = config_repository(program, args, primary, [override for _, override in overrides])
    # The schema types the app's own config; the keys of another (-cn, -cp) are Hydra's to check.
    own_config = primary == config_name and args.config_path in (None, APP_CONFIG_PATH)
    config = OmegaConf.structured(schema)
    for arg, override in overrides:
        for element in sweep_elements(program, parser, arg, override):
            # Hydra's own rule: an override is a group choice when the group exists.
            if repo.group_exists(element.key_or_group) and not isinstance(element.value(), dict):
                check_group_choice(program, arg, element, repo, primary)
            elif own_config and not element.is_hydra_override():
                check_key(program, arg, element, config, schema, positive)
    if args.hydra_help:
        # Hydra composes its own help from its own config alone, where an override of the app's
        # config fails with a traceback (--hydra-help preset=cartpole): hand on only Hydra's.
        app_overrides = {arg for arg, override in overrides if not override.is_hydra_override()}
        return [arg for arg in argv if arg not in app_overrides]
    return argv


def parse_hydra_flags(program, argv):
    """Hydra's flags and overrides, read by the parser that hydra.main reads them with."""
    parser = get_args_parser()
    parser.error = lambda message: fail(program, message)  # not argparse's usage text
    args = parser.parse_args(argv)  # --version prints and exits here, as under Hydra
    # Hydra raises (a traceback) on these only once it runs; --help and --hydra-help come first.
    if args.help:
        return args
    if args.resolve and args.cfg is None:
        fail(program, "--resolve works only with --cfg or --help")
    if args.hydra_help:
        return args
    commands = {
        "--run": args.run,
        "--multirun": args.multirun,
        "--cfg": args.cfg is not None,
        "--info": args.info is not None,
        "--shell-completion": args.shell_completion,
    }
    given = [flag for flag, present in commands.items() if present]
    if len(given) > 1:
        fail(program, f"{' and '.join(given)}: give only one of {', '.join(commands)}")
    return args


def check_shell_completion(program, arguments):
    try:
        subcommands = OmegaConf.from_dotlist(arguments).keys() & {"install", "uninstall", "query"}
    except OmegaConfBaseException:
        subcommands = ()
    if len(subcommands) != 1:
        fail(program, "--shell-completion takes one of install=SHELL, uninstall=SHELL, query=SHELL")


def parse_override(program, parser, arg):
    try:
        [override] = parser.parse_overrides([arg])
    except HydraException as e:
        fail(program, f"{arg}: {first_line(e)}")
    return override


def sweep_elements(program, parser, arg, override):
    """The plain overrides that a sweep (seed=0,1, range(8), choice(...)) stands for, so that each
    value is checked as if given alone; [override] for a plain override."""
    if not override.is_sweep_override():
        return [override]
    if not override.is_discrete_sweep() or override.value_type == ValueType.GLOB_CHOICE_SWEEP:
        return [override]  # interval(), glob(): no list of values; the key is still checked
    key = override.get_key_element()
    return [
        parse_override(program, parser, f"{key}={text}")
        for text in override.sweep_string_iterator()
    ]


def config_repository(program, args, primary, overrides):
    """Hydra's view of the app's configs: the search path that hydra.main builds, with -cp, -cd
    and hydra.searchpath applied as Hydra applies them."""
    if args.config_dir is not None and not os.path.isdir(args.config_dir):
        fail(program, f"--config-dir {args.config_dir}: no such folder")
    search_dir = compute_search_path_dir(
        str(CONFIG_DIR / "config.py"), None, args.config_path or APP_CONFIG_PATH
    )
    if not search_dir.startswith("pkg://") and not os.path.isdir(search_dir):
        fail(program, f"--config-path {args.config_path}: no such folder ({search_dir})")
    search_path = create_config_search_path(search_dir)
    if args.config_dir is not None:  # where Hydra puts it: after the app's own folder
        search_path.prepend(
            provider="command-line",
            path=f"file://{os.path.abspath(args.config_dir)}",
            anchor=SearchPathQuery(provider="schema"),
        )
    loader = ConfigLoaderImpl(config_search_path=search_path)
    repo = CachingConfigRepository(loader.repository)
    try:  # Hydra's own step: hydra.searchpath (primary config or override) adds config folders
        loader._process_config_searchpath(primary, overrides, repo)
    except HydraException as e:
        fail(program, f"hydra.searchpath: {first_line(e)}")
    if not repo.config_exists(primary):
        names = [n for n in repo.get_group_options("", ObjectType.CONFIG) if not n.startswith("_")]
        fail(program, f"--config-name {primary}: no such config; choose from {', '.join(names)}")
    return repo


def check_group_choice(program, arg, override, repo, primary):
    """Fail unless the group override (preset=minatar, hydra/launcher=slurm) names options that
    exist and that the primary config `primary` takes, as Hydra composes its defaults list."""
    group = override.key_or_group
    chosen = override.value() if isinstance(override.value(), list) else [override.value()]
    unknown = [c for c in chosen if isinstance(c, str) and not repo.config_exists(f"{group}/{c}")]
    if unknown and not override.is_delete():
        options = repo.get_group_options(group, ObjectType.CONFIG)
        fail(program, f"{arg}: no such {group}; choose from {', '.join(options)}")
    try:
        create_defaults_list(repo, primary, [override], prepend_hydra=True, skip_missing=True)
    except (HydraException, ValueError) as e:
        fail(program, f"{arg}: {first_line(e)}")


def check_key(program, arg, override, config, schema, positive):
    """Fail unless the override names a key of `config` (the app's schema) with a value of its
    type; `config` takes the value, so later overrides are checked against it."""
    key = override.key_or_group
    exists = OmegaConf.select(config, key, default=_MISSING) is not _MISSING
    if override.is_add() or (override.is_force_add() and not exists):
        return  # +key=value adds a key to the config
    if not exists:
        fail(program, f"{arg}: no such key (each key is documented in {CONFIG_DIR}/config.py)")
    if override.is_delete() or override.is_sweep_override():
        return
    try:
        OmegaConf.update(config, key, override.value(), merge=True)
    except OmegaConfBaseException:
        kind = expected_kind(schema, key, key in positive)
        fail(program, f"{arg}: {key} must be {kind}, got {override.value()!r}")


def expected_kind(schema, key, positive):
    """The kind of value that `key` of the dataclass `schema` takes, in words."""
    for part in key.split("."):
        schema = typing.get_type_hints(schema)[part]
    kinds = set(typing.get_args(schema)) - {type(None)} or {schema}
    words = {bool: "true or false", int: "an integer", float: "a number", str: "text"}
    if positive:
        words = {**words, int: "a positive integer", float: "a positive number"}
    text = " or ".join(words.get(kind, getattr(kind, "__name__", str(kind))) for kind in kinds)
    return f"{text} (or null)" if type(None) in typing.get_args(schema) else text


def first_line(error):
    """Hydra's messages go on for lines (search paths, hints); their first line names the
    problem."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def fail(program, message):
    print(f"{program}: error: {message}", file=sys.stderr)
    sys.exit(2)
