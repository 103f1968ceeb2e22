"""The GPU contract's checkers: rendered settings against the real vLLM and LMCache code.

Every check takes what the roles rendered (build/gpu-contract/rendered.json) and hands
it to the pinned packages' own parsers, loaders and registries; nothing here restates a
flag, a key or a connector name. Each checker raises ContractError with a message that
names the rendered file and what the package said. The tests in this directory call
them on every rendered file, and test_contract_can_fail.py calls the same checkers on
broken copies to prove they refuse them.

Runs only in the contract venv (build/gpu-contract/venv): it imports vllm and lmcache.
"""
import argparse
import ast
import contextlib
import importlib
import importlib.util
import inspect
import io
import json
import logging
import os
import re
import shlex
import sys
import types


class ContractError(AssertionError):
    """A rendered setting that the pinned vLLM or LMCache refuses or ignores."""


# --- systemd: what the units hand to the processes -------------------------------------

def parse_env_file(text):
    """KEY=VALUE lines of a systemd EnvironmentFile (comments, blank lines, quotes)."""
    env = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise ContractError("line %d is not KEY=VALUE: %r" % (number, line))
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key] = value
    return env


def unit_directives(text, name):
    """The values of one directive (e.g. ExecStart) of a unit file."""
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(name + "=")]


def expand_exec(exec_start, env):
    """argv of an ExecStart= line the way systemd builds it: $VAR splits the value at
    whitespace into several arguments, ${VAR} is one argument. An unset variable is a
    rendering error here (systemd would silently pass nothing)."""
    argv = []
    for word in shlex.split(exec_start):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            if whole.group(1) not in env:
                raise ContractError("ExecStart uses $%s, which no EnvironmentFile sets" % whole.group(1))
            argv.extend(env[whole.group(1)].split())
            continue

        def one(match):
            if match.group(1) not in env:
                raise ContractError("ExecStart uses ${%s}, which no EnvironmentFile sets" % match.group(1))
            return env[match.group(1)]

        argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", one, word))
    return argv


# --- log capture: a warning from a loader is a failure ---------------------------------

class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@contextlib.contextmanager
def warnings_logged(prefixes=("lmcache", "vllm")):
    """Collect WARNING and above from the packages' loggers (LMCache's do not propagate)."""
    handler = _Collect()
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name.split(".")[0] in prefixes]
    loggers += [logging.getLogger(prefix) for prefix in prefixes]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


# --- vLLM ------------------------------------------------------------------------------

CUDA_KERNELS = "vllm._C_stable_libtorch"


def select_cuda_platform():
    """Make vLLM's current platform its real CUDA platform class, on a machine without a GPU.

    vLLM builds its CLI parser from config classes whose defaults ask the current
    platform for its device type; with no GPU it detects none and the parser cannot be
    built at all. The CUDA platform module (vllm.platforms.cuda) imports vLLM's CUDA
    kernels first, and that extension needs the driver's libcuda.so.1. Returns what
    importing the kernels did: None when it worked (a GPU machine), else the ImportError
    text; in that case an empty stand-in for that one extension is put in sys.modules
    (no kernel is registered), so everything else is vLLM's own code for CUDA.
    """
    from vllm import platforms

    boundary = None
    try:
        importlib.import_module(CUDA_KERNELS)
    except ImportError as exc:
        boundary = str(exc)
        sys.modules[CUDA_KERNELS] = types.ModuleType(CUDA_KERNELS)
    cuda = importlib.import_module("vllm.platforms.cuda")
    platforms._current_platform = cuda.CudaPlatform()  # pylint: disable=protected-access
    return boundary


def entry_point_main(module):
    """The main() that `python -m MODULE` runs (the module's __main__ block calls it)."""
    mod = importlib.import_module(module)
    tree = ast.parse(inspect.getsource(mod))
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.ImportFrom) and any(a.name == "main" for a in stmt.names):
                    source = importlib.util.resolve_name("." * stmt.level + (stmt.module or ""), mod.__package__)
                    return getattr(importlib.import_module(source), "main")
            if "main()" in ast.unparse(node) and callable(getattr(mod, "main", None)):
                return mod.main
    raise ContractError("%s has no `if __name__ == '__main__'` block that calls a main()" % module)


ENTRY_NAMES = ("FlexibleArgumentParser", "make_arg_parser", "validate_parsed_serve_args")


def entry_point_parts(main):
    """{name: object} for ENTRY_NAMES as main() sees them: imported inside main() (also
    relative imports) or from its module's globals. A name main() does not use is missing."""
    source = inspect.getsource(main)
    tree = ast.parse(inspect.cleandoc("\n" + source) if source[:1].isspace() else source)
    package = importlib.import_module(main.__module__).__package__
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source_module = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            for alias in node.names:
                if alias.name in ENTRY_NAMES:
                    found[alias.asname or alias.name] = getattr(importlib.import_module(source_module), alias.name)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    for name in ENTRY_NAMES:
        if name not in found and name in used and name in main.__globals__:
            found[name] = main.__globals__[name]
    return {name: found[name] for name in ENTRY_NAMES if name in found and name in used}


def vllm_parser(entry_module):
    """The parser `python -m ENTRY_MODULE` builds, made the way its main() makes it, and
    the serve-argument check main() runs after parsing."""
    parts = entry_point_parts(entry_point_main(entry_module))
    missing = [n for n in ENTRY_NAMES if n not in parts]
    if missing:
        raise ContractError("%s's main() no longer uses %s: the contract cannot build its parser" % (entry_module, missing))
    parser = parts["make_arg_parser"](parts["FlexibleArgumentParser"](
        description="vLLM OpenAI-Compatible RESTful API server."))
    parser.validate_parsed_serve_args = parts["validate_parsed_serve_args"]
    return parser


def argparse_error(stderr):
    """What argparse said after its usage text: the "error:" line and what follows it."""
    lines = stderr.splitlines()
    start = next((i for i, line in enumerate(lines) if "error:" in line), max(len(lines) - 5, 0))
    return " ".join(line.strip() for line in lines[start:] if line.strip())


def parse_vllm_cli(parser, cli, model_dir, where, visible_gpus=None):
    """Parse the engine's command line with vLLM's parser, its serve-args checks and
    AsyncEngineArgs.from_cli_args. The --model value is replaced by model_dir (an
    existing directory): from_cli_args resolves the model path, and the node's model is
    not here. visible_gpus: how many GPUs the instance sees (its CUDA_VISIBLE_DEVICES),
    what the CUDA platform reports as the device count on the node. Returns
    (namespace, engine_args)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    cli = list(cli)
    if "--model" not in cli:
        raise ContractError("%s: the command line has no --model" % where)
    cli[cli.index("--model") + 1] = model_dir
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(cli)
    except SystemExit as exc:
        raise ContractError("%s: vLLM's parser refused the command line (exit %s): %s"
                            % (where, exc.code, argparse_error(err.getvalue()))) from None
    try:
        parser.validate_parsed_serve_args(args)
        engine_args = AsyncEngineArgs.from_cli_args(args)
    except Exception as exc:  # pylint: disable=broad-except
        raise ContractError("%s: vLLM refused the parsed arguments: %s: %s"
                            % (where, type(exc).__name__, exc)) from None
    engine_configs(engine_args, where, visible_gpus)
    return args, engine_args


def engine_configs(engine_args, where, visible_gpus=None):
    """The engine's config classes that do not need the model, built from the engine
    arguments as EngineArgs.create_engine_config builds them (their validators run: a KV
    cache dtype vLLM does not know, a memory fraction out of range, a bad parallel layout).
    create_engine_config itself needs the model's config and, to inspect the model's
    architecture, the GPU's compute capability. ParallelConfig asks the platform how many
    GPUs the process sees: the instance's CUDA_VISIBLE_DEVICES count (visible_gpus) on
    the node, none here."""
    from unittest import mock

    from vllm.config import CacheConfig, ParallelConfig
    from vllm.platforms import current_platform

    built = {}
    count = mock.patch.object(type(current_platform), "device_count", classmethod(lambda cls: visible_gpus or 0))
    try:
        built["cache"] = CacheConfig(block_size=engine_args.block_size,
                                     gpu_memory_utilization=engine_args.gpu_memory_utilization,
                                     cache_dtype=engine_args.kv_cache_dtype)
        with count:
            built["parallel"] = ParallelConfig(tensor_parallel_size=engine_args.tensor_parallel_size,
                                               pipeline_parallel_size=engine_args.pipeline_parallel_size,
                                               data_parallel_size=engine_args.data_parallel_size)
    except Exception as exc:  # pylint: disable=broad-except
        raise ContractError("%s: vLLM's engine configs refused the arguments: %s: %s"
                            % (where, type(exc).__name__, exc)) from None
    return built


def kv_transfer_config(text, where):
    """vLLM's KVTransferConfig from the --kv-transfer-config JSON, as the parser builds it."""
    from vllm.config.kv_transfer import KVTransferConfig

    try:
        return KVTransferConfig(**json.loads(text))
    except Exception as exc:  # pylint: disable=broad-except
        raise ContractError("%s: KVTransferConfig refused %s: %s" % (where, text, exc)) from None


def connector_class(config, where):
    """The class vLLM's KVConnectorFactory resolves for a KVTransferConfig (the registry,
    or the module path when one is named), with the factory's own checks."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.utils.func_utils import supports_kw

    try:
        cls = KVConnectorFactory.get_connector_class(config)
    except Exception as exc:  # pylint: disable=broad-except
        raise ContractError("%s: vLLM's connector factory cannot resolve kv_connector %r (module path %r): %s: %s"
                            % (where, config.kv_connector, config.kv_connector_module_path,
                               type(exc).__name__, exc)) from None
    if not supports_kw(cls, "kv_cache_config"):
        raise ContractError("%s: %s.%s does not take kv_cache_config, which vLLM's factory passes"
                            % (where, cls.__module__, cls.__qualname__))
    return cls


# --- LMCache ---------------------------------------------------------------------------

def load_lmcache_config(path, env, where):
    """Load an lmcache-config.yaml the way the in-process connector does
    (lmcache.integration.vllm.utils.lmcache_get_or_create_config with LMCACHE_CONFIG_FILE
    and the instance's LMCACHE_* environment). Any warning the loader logs (an unknown
    key, a deprecated one, a value it could not parse) is a failure."""
    from lmcache.integration.vllm import utils as lmutils

    saved = dict(os.environ)
    os.environ.update({k: v for k, v in env.items() if k.startswith("LMCACHE_")})
    os.environ["LMCACHE_CONFIG_FILE"] = path
    lmutils._config_instance = None  # pylint: disable=protected-access
    try:
        with warnings_logged(("lmcache",)) as records:
            config = lmutils.lmcache_get_or_create_config()
    except Exception as exc:  # pylint: disable=broad-except
        raise ContractError("%s: LMCache's loader refused the file: %s: %s" % (where, type(exc).__name__, exc)) from None
    finally:
        lmutils._config_instance = None  # pylint: disable=protected-access
        os.environ.clear()
        os.environ.update(saved)
    if records:
        raise ContractError("%s: LMCache's loader warned: %s" % (where, "; ".join(r.getMessage() for r in records)))
    return config


def lmcache_server_parse(argv, where):
    """Parse `lmcache server ...` with LMCache's own CLI (lmcache.cli.main's parser and
    the server command's arguments), then build every config the server's execute()
    builds before it starts serving. Returns {name: config}."""
    from lmcache.cli.commands import register_commands

    parser = argparse.ArgumentParser(prog="lmcache")
    register_commands(parser.add_subparsers(dest="command"), argv)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
    except SystemExit as exc:
        raise ContractError("%s: `lmcache server`'s parser refused the arguments (exit %s): %s"
                            % (where, exc.code, argparse_error(err.getvalue()))) from None
    from lmcache.v1.distributed.config import parse_args_to_config
    from lmcache.v1.mp_observability.config import parse_args_to_observability_config
    from lmcache.v1.multiprocess.config import (
        parse_args_to_coordinator_config,
        parse_args_to_http_frontend_config,
        parse_args_to_mp_server_config,
    )

    configs = {}
    for build in (parse_args_to_http_frontend_config, parse_args_to_mp_server_config, parse_args_to_config,
                  parse_args_to_observability_config, parse_args_to_coordinator_config):
        try:
            configs[build.__name__] = build(args)
        except Exception as exc:  # pylint: disable=broad-except
            raise ContractError("%s: LMCache's %s refused the arguments: %s: %s"
                                % (where, build.__name__, type(exc).__name__, exc)) from None
    return args, configs


class RecordingDict(dict):
    """A dict that remembers which keys were read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)

    def pop(self, key, *default):
        self.read.add(key)
        return super().pop(key, *default)


def l2_adapter_unread_keys(adapter_json, adapter_config, where):
    """Keys of an --l2-adapter JSON that the adapter's own from_dict never reads
    (LMCache's L2 adapter configs ignore unknown keys without a word)."""
    spec = json.loads(adapter_json)
    if spec.get("type") == "plugin" and str(spec.get("class_name", "")).endswith("S3L2Adapter"):
        # The lmcache role's half-open S3 adapter (roles/lmcache/files/kvcache_s3_l2.py) through LMCache's
        # plugin adapter: its adapter_params are the s3 adapter's keys, read by S3L2AdapterConfig.from_dict,
        # plus its own retry_after_seconds.
        from lmcache.v1.distributed.l2_adapters.s3_l2_adapter import S3L2AdapterConfig

        params = {k: v for k, v in (spec.get("adapter_params") or {}).items() if k != "retry_after_seconds"}
        values = RecordingDict(params)
        try:
            S3L2AdapterConfig.from_dict(values)
        except Exception as exc:  # pylint: disable=broad-except
            raise ContractError("%s: S3L2AdapterConfig.from_dict refused %s: %s" % (where, params, exc)) from None
        return sorted("adapter_params." + k for k in set(values) - values.read)
    values = RecordingDict(spec)
    try:
        type(adapter_config).from_dict(values)
    except Exception as exc:  # pylint: disable=broad-except
        raise ContractError("%s: %s.from_dict refused %s: %s" % (where, type(adapter_config).__name__, adapter_json, exc)) from None
    return sorted(set(values) - values.read - {"type"})


# --- keys that code reads by name ------------------------------------------------------

def _source_of(name):
    """The source text of a module, read from its file without importing it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    with open(spec.origin, encoding="utf-8") as handle:
        return handle.read()


def string_constants(module_names):
    """Every string constant in the modules' source (read, not imported), and the %s / {}
    format strings as regular expressions (keys built as "remote_storage_plugin.%s.base_path")."""
    literals, patterns = set(), []
    for name in module_names:
        source = _source_of(name)
        if source is None:
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200:
                literals.add(node.value)
                if "%s" in node.value or "{" in node.value:
                    parts = re.split(r"%s|\{[^}]*\}", node.value)
                    # a placeholder stands for one name part (no dot, no underscore), and a
                    # format needs some text of its own ("%s_%s" matches any key)
                    if len("".join(parts)) >= 6:
                        patterns.append(re.compile("^" + "[A-Za-z0-9-]+".join(re.escape(p) for p in parts) + "$"))
    return literals, patterns


def package_modules(package):
    """Names of every module of a package, from its files, without importing them."""
    import importlib.util

    base = os.path.dirname(importlib.util.find_spec(package).origin)
    names = []
    for folder, _dirs, files in os.walk(base):
        for file in files:
            if file.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, file), base)[:-3].replace(os.sep, ".")
                if rel == "__init__":
                    names.append(package)
                else:
                    names.append(package + "." + (rel[:-len(".__init__")] if rel.endswith(".__init__") else rel))
    return sorted(names)


def unread_keys(keys, literals, patterns):
    """The keys that appear nowhere in the code as a string (or a format of one)."""
    return sorted(k for k in keys if k not in literals and not any(p.match(k) for p in patterns))


# --- calls between the packages --------------------------------------------------------

class Call:
    """One call in `caller` (module:line) to `callee`, with the shape of its arguments."""

    def __init__(self, module, line, text, callee, n_args, keywords, starred):
        self.module, self.line, self.text = module, line, text
        self.callee, self.n_args, self.keywords, self.starred = callee, n_args, keywords, starred

    def where(self):
        return "%s:%d" % (self.module, self.line)

    def callee_name(self):
        return "%s.%s" % (getattr(self.callee, "__module__", None) or "?", getattr(self.callee, "__qualname__", self.callee))


def _signature(callee, skip_self):
    sig = inspect.signature(callee)
    if skip_self:
        params = list(sig.parameters.values())[1:]
        sig = sig.replace(parameters=params)
    return sig


def check_call(call):
    """None when the callee's signature accepts the call's arguments, else the reason."""
    if call.starred:
        return None  # *args / **kwargs: the shape is not known statically
    try:
        sig = _signature(call.callee, getattr(call, "skip_self", False))
    except (TypeError, ValueError):
        return None  # a builtin without a signature
    try:
        sig.bind(*[object()] * call.n_args, **{k: object() for k in call.keywords})
    except TypeError as exc:
        return "%s calls %s(%s) but %s takes %s: %s" % (
            call.where(), call.callee_name(), call.text, call.callee_name(), sig, exc)
    return None


def _owned(obj, package):
    return (getattr(obj, "__module__", None) or "").split(".")[0] == package


def _resolve(expr, scope):
    """The objects a Name / Attribute expression can be, given a scope {name: [objects]}."""
    if isinstance(expr, ast.Name):
        return list(scope.get(expr.id, []))
    if isinstance(expr, ast.Attribute):
        found = []
        for base in _resolve(expr.value, scope):
            value = getattr(base, expr.attr, None)
            if value is not None:
                found.append(value)
        return found
    return []


def _import_targets(node):
    """{local name: object} for an import statement (objects that cannot be imported are left out)."""
    out = {}
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        for alias in node.names:
            try:
                module = importlib.import_module(node.module)
                value = getattr(module, alias.name, None)
                if value is None:
                    value = importlib.import_module("%s.%s" % (node.module, alias.name))
            except Exception:  # pylint: disable=broad-except
                continue
            out[alias.asname or alias.name] = value
    elif isinstance(node, ast.Import):
        for alias in node.names:
            try:
                module = importlib.import_module(alias.name)
            except Exception:  # pylint: disable=broad-except
                continue
            if alias.asname:
                out[alias.asname] = module
            else:
                out[alias.name.split(".")[0]] = importlib.import_module(alias.name.split(".")[0])
    return out


def cross_calls(module_name, other):
    """Every call in module `module_name` whose callee belongs to package `other`:
    names bound at module level (as the module holds them at run time, so a
    try/except import resolves to what was really imported), names imported inside a
    function, plain `name = other_name` assignments inside a function, and
    super().__init__() in a class derived from a class of `other`."""
    module = importlib.import_module(module_name)
    tree = ast.parse(inspect.getsource(module))
    module_scope = {name: [value] for name, value in vars(module).items()}
    calls = []

    def function_scope(func):
        local = {k: list(v) for k, v in module_scope.items()}
        for inner in ast.walk(func):
            if isinstance(inner, (ast.Import, ast.ImportFrom)):
                for name, value in _import_targets(inner).items():
                    local[name] = [value] + [v for v in local.get(name, []) if v is not value]
        for inner in ast.walk(func):
            if isinstance(inner, ast.Assign) and len(inner.targets) == 1 and isinstance(inner.targets[0], ast.Name):
                values = _resolve(inner.value, local)
                if values:
                    local[inner.targets[0].id] = local.get(inner.targets[0].id, []) + values
        return local

    def self_attributes(klass):
        """{attr: class of `other`} for `self.attr = SomeClass(...)` in the class's methods."""
        found = {}
        for item in klass.body:
            if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            scope = function_scope(item)
            for node in ast.walk(item):
                if (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and isinstance(node.targets[0], ast.Attribute)
                        and isinstance(node.targets[0].value, ast.Name) and node.targets[0].value.id == "self"
                        and isinstance(node.value, ast.Call)):
                    for value in _resolve(node.value.func, scope):
                        if inspect.isclass(value) and _owned(value, other):
                            found.setdefault(node.targets[0].attr, []).append(value)
        return found

    def collect(node, scope, bases, attrs=None):
        for call in [n for n in ast.walk(node) if isinstance(n, ast.Call)]:
            func, skip_self = call.func, False
            if (isinstance(func, ast.Attribute) and func.attr == "__init__" and isinstance(func.value, ast.Call)
                    and isinstance(func.value.func, ast.Name) and func.value.func.id == "super"):
                targets = [b.__init__ for b in bases[:1]
                           if _owned(b, other) and inspect.isfunction(b.__init__) and _owned(b.__init__, other)]
                skip_self = True
            elif (attrs and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute)
                  and isinstance(func.value.value, ast.Name) and func.value.value.id == "self"
                  and func.value.attr in attrs):
                # self.engine.method(...) where self.engine = OtherPackageClass(...): the
                # method as the class defines it (an instance method: self is bound).
                targets = [getattr(c, func.attr) for c in attrs[func.value.attr]
                           if inspect.isfunction(getattr(c, func.attr, None))]
                skip_self = True
            else:
                targets = [t for t in _resolve(func, scope) if callable(t) and _owned(t, other)]
            starred = any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)
            text = ", ".join([ast.unparse(a) for a in call.args]
                             + [("%s=%s" % (k.arg, ast.unparse(k.value))) if k.arg else "**" + ast.unparse(k.value)
                                for k in call.keywords])
            for target in targets:
                if any(c.line == call.lineno and c.callee is target for c in calls):
                    continue
                found = Call(module_name, call.lineno, text, target, len(call.args),
                             [k.arg for k in call.keywords if k.arg], starred)
                found.skip_self = skip_self
                calls.append(found)

    for top in tree.body:
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)):
            collect(top, function_scope(top), [])
        elif isinstance(top, ast.ClassDef):
            bases = [b for expr in top.bases for b in _resolve(expr, module_scope) if inspect.isclass(b)]
            attrs = self_attributes(top)
            for item in top.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    collect(item, function_scope(item), bases, attrs)
                else:
                    collect(item, module_scope, bases)
        else:
            collect(top, module_scope, [])
    return calls


def override_problems(cls, base):
    """Methods of `base` (the interface the caller programs against) that `cls` overrides
    with a signature that does not take what the base's does: a parameter of the base
    missing (and no **kwargs), or a parameter the base does not have that is required."""
    problems = []
    for name, member in vars(base).items():
        if name.startswith("__") or not inspect.isfunction(member):
            continue
        override = getattr(cls, name, None)
        if override is None or override is member or not inspect.isfunction(override):
            continue
        if getattr(override, "__module__", "").split(".")[0] == getattr(base, "__module__", "").split(".")[0]:
            continue  # overridden inside the base's own package
        want, have = inspect.signature(member).parameters, inspect.signature(override).parameters
        var_kw = any(p.kind is p.VAR_KEYWORD for p in have.values())
        var_pos = any(p.kind is p.VAR_POSITIONAL for p in have.values())
        for pname, param in want.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                if param.kind is param.VAR_KEYWORD and not var_kw:
                    problems.append("%s.%s%s drops **%s of %s.%s%s" % (
                        cls.__qualname__, name, inspect.signature(override), pname, base.__qualname__, name,
                        inspect.signature(member)))
                continue
            if pname not in have and not (var_kw and var_pos):
                problems.append("%s.%s%s has no parameter %r that %s.%s%s passes" % (
                    cls.__qualname__, name, inspect.signature(override), pname, base.__qualname__, name,
                    inspect.signature(member)))
        for pname, param in have.items():
            if (pname not in want and param.default is param.empty
                    and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)):
                problems.append("%s.%s%s requires %r, which %s.%s%s does not pass" % (
                    cls.__qualname__, name, inspect.signature(override), pname, base.__qualname__, name,
                    inspect.signature(member)))
    return problems


def relied_modules(start, zones):
    """`start` and the modules it imports (also inside functions) that lie in `zones`
    (module name prefixes), followed transitively: what a connector class pulls in."""
    seen, todo = [], [start]
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        try:
            module = importlib.import_module(name)
            tree = ast.parse(inspect.getsource(module))
        except Exception:  # pylint: disable=broad-except
            continue
        seen.append(name)
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + ["%s.%s" % (node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for target in targets:
                if any(target == z or target.startswith(z + ".") for z in zones) and target not in seen:
                    try:
                        importlib.import_module(target)
                    except Exception:  # pylint: disable=broad-except
                        continue
                    todo.append(target)
    return seen
