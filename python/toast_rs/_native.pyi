from typing import Any, Dict, List, Tuple

ABI_VERSION: str
BUILD_PLUGIN_DIR: str

def kernels() -> List[str]: ...

class Runtime:
    def __init__(
        self,
        backend: str,
        dispatch: Dict[str, str],
        backend_path: List[str],
        fallback_dirs: List[str],
    ) -> None: ...
    def call(self, name: str, args: Tuple[Any, ...]) -> None: ...
    def stats(self) -> Dict[str, Dict[str, Any]]: ...
    def reset_stats(self) -> None: ...
