"""The model repository: Triton's layout, ``config.pbtxt`` parsing, auto-complete, versions, atomic install.

The typed config values live in `edged.repository.model_config`; this package turns files into them and
them into Triton's JSON form. It imports no runtime: signatures come from the backends.
"""

from edged.durable import write_atomic as write_file_atomic
from edged.repository._autocomplete import DEFAULT_MAX_BATCH_SIZE, autocomplete
from edged.repository._build import build_model_config, parse_model_config, unknown_fields
from edged.repository._checks import (
    BUILTIN_BACKENDS,
    check_batching,
    check_io_and_groups,
    check_platform_backend,
    check_reshapes,
    check_supported,
    check_tensor_types,
    check_warmup,
    not_a_tensor,
    unknown_backend,
)
from edged.repository._from_json import model_config_from_json
from edged.repository._json import model_config_to_json
from edged.repository._normalize import normalize
from edged.repository._pbtxt import Field, Ident, Message, dump, parse
from edged.repository.confine import (
    MAX_LABEL_BYTES,
    check_config_files,
    confined_path,
    read_confined,
    with_confined_parameters,
)
from edged.repository.layout import (
    CONFIG_FILENAME,
    MAX_CONFIG_BYTES,
    Fingerprint,
    Settling,
    changed_versions,
    check_model_name,
    check_override_size,
    detect_runtime,
    find_models,
    fingerprint,
    install_version,
    list_versions,
    load_model_config,
    missing_versions,
    parse_version,
    resolve_runtime,
    select_versions,
    warn_not_utf8,
)

__all__ = [
    "BUILTIN_BACKENDS",
    "CONFIG_FILENAME",
    "DEFAULT_MAX_BATCH_SIZE",
    "MAX_CONFIG_BYTES",
    "MAX_LABEL_BYTES",
    "Field",
    "Fingerprint",
    "Ident",
    "Message",
    "Settling",
    "autocomplete",
    "build_model_config",
    "changed_versions",
    "check_batching",
    "check_config_files",
    "check_io_and_groups",
    "check_model_name",
    "check_override_size",
    "check_platform_backend",
    "check_reshapes",
    "check_supported",
    "check_tensor_types",
    "check_warmup",
    "confined_path",
    "detect_runtime",
    "dump",
    "find_models",
    "fingerprint",
    "install_version",
    "list_versions",
    "load_model_config",
    "missing_versions",
    "model_config_from_json",
    "model_config_to_json",
    "normalize",
    "not_a_tensor",
    "parse",
    "parse_model_config",
    "parse_version",
    "read_confined",
    "resolve_runtime",
    "select_versions",
    "unknown_backend",
    "unknown_fields",
    "warn_not_utf8",
    "with_confined_parameters",
    "write_file_atomic",
]
