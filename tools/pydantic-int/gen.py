"""Writes internal/request/testdata/pydantic_int.jsonl: what pydantic's lax
int (the type of vLLM's max_tokens and max_completion_tokens, models with
no strict mode) makes of each JSON value, read as FastAPI reads a body
(json.loads, then model_validate).

Usage: python3 tools/pydantic-int/gen.py > internal/request/testdata/pydantic_int.jsonl
It needs pydantic 2 (vLLM's major version); each line is
{"json": <the value's JSON text>, "int": <decimal string>} when accepted,
{"json": ..., "error": <pydantic's error type>} when refused. The first
line records the pydantic and pydantic-core versions.
"""

import json
import sys
from typing import Optional

import pydantic
import pydantic_core
from pydantic import BaseModel, ValidationError

if not pydantic.VERSION.startswith("2."):
    sys.exit(f"pydantic {pydantic.VERSION}: vLLM validates with pydantic 2")


class Req(BaseModel):
    max_tokens: Optional[int] = None


INPUTS = [
    # JSON integers
    "0", "1", "2", "16", "-0", "-1", "-2", "4096",
    "2147483647", "2147483648", "4294967296",
    "9007199254740992", "9007199254740993",
    "9223372036854775807", "9223372036854775808", "-9223372036854775808",
    "-9223372036854775809", "18446744073709551616",
    "123456789012345678901234567890", "-123456789012345678901234567890",
    # JSON numbers with a fraction or an exponent
    "2.0", "2.00", "0.0", "-0.0", "-2.0", "2.5", "0.5", "-0.5", "1.9999999999999999",
    "2.0000000000000001", "1e3", "1E3", "1e+3", "1e-3", "1.5e1", "15e-1", "0e0",
    "1e0", "2e-0", "1e15", "1e16", "1e18", "9.2233720368547758e18", "1e19",
    "1e20", "1e300", "1e308", "1e309", "-1e309", "-1e3", "1e400", "4096.0",
    "9007199254740993.0", "0.1e1", "100e-2", "1.0000001", "-0e0", "1E-0",
    "0.0000", "100000000000000000000.0", "9.2233720368547748e18",
    "-9.2233720368547758e18", "-9.2233720368547778e18", "4.9e-324", "1e-400",
    # booleans and null
    "true", "false", "null",
    # strings
    '"2"', '"0"', '"-0"', '"-2"', '"+2"', '" 2"', '"2 "', '" 2 "', '"\\t2\\n"',
    '"2.0"', '"2.5"', '"2.00"', '"1e3"', '"1_000"', '"1__0"', '"_1"', '"0x10"',
    '"010"', '"00"', '"-"', '"+"', '""', '" "', '"abc"', '"2a"', '"inf"',
    '"nan"', '"NaN"', '"Infinity"', '"true"', '"null"', '"٢"', '"２"',
    '"123456789012345678901234567890"', '"9223372036854775808"', '"+0"',
    '"- 2"', '"2."', '".5"', '"0.0"', '"-0.0"', '"1.0e3"', '"2.000000000000000000001"',
    '"1_"', '"+_1"', '"-_1"', '"1_0.0"', '"2.0_0"', '"2._0"', '"+2.0"', '"2.0 "', '"2.0000"',
    '"0_0"', '"0_1"', '"00_1"', '"2.0.0"', '"2,0"', '"++2"', '"+-2"', '"2e0"', '"2.0e0"',
    '"\\u00a02"', '"\\u20002"', '"\\u30002"', '"\\r2"', '"\\f2"', '"\\u000b2"', '"\\u001c2"',
    '"\\u00852"', '"\\u200b2"', '"\\ufeff2"', '"2\\u0000"', '"\\u00002"',
    '"\\u16802"', '"\\u20282"', '"\\u20292"', '"\\u202f2"', '"\\u205f2"', '"\\u180e2"',
    '"\\u001f2"', '"\\u200a2"', '"-2.0"', '"-9223372036854775809"', '" +2 "', '"2\\t"',
    # other JSON values
    "[]", "[2]", "{}", '{"a":2}',
]


def main():
    out = sys.stdout
    out.write(json.dumps({"pydantic": pydantic.VERSION, "pydantic_core": pydantic_core.__version__}) + "\n")
    for text in INPUTS:
        body = '{"max_tokens":' + text + "}"
        try:
            data = json.loads(body)
        except ValueError as e:
            sys.exit(f"{text}: not JSON: {e}")
        try:
            v = Req.model_validate(data).max_tokens
        except ValidationError as e:
            out.write(json.dumps({"json": text, "error": e.errors()[0]["type"]}, ensure_ascii=False) + "\n")
            continue
        rec = {"json": text}
        if v is None:
            rec["null"] = True
        else:
            rec["int"] = str(v)
        out.write(json.dumps(rec, ensure_ascii=False) + "\n")


main()
