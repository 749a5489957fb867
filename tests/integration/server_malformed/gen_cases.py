#!/usr/bin/env python3
"""Regenerates cases.jsonl: malformed requests that must each get a 4xx (tests/unit/server/malformed_test.cpp).

Entry fields: name; either raw (latin-1 text sent verbatim, with the expansion in raw_repeat) or method/path/
headers/body. body_hex replaces body with bytes; body_repeat [prefix, unit, count, suffix] builds a large body;
header_repeat [name, value, count] adds many headers; content_length overrides (null: no header);
chunks sends the body chunked (list of latin-1 chunk strings, sent verbatim after the headers); status: exact
expected code (else any 4xx)."""
import json

cases = []
CHAT = "/v1/chat/completions"
MSG = '"messages":[{"role":"user","content":"hi"}]'


def body(name, b, path=CHAT, status=None, **kw):
    c = {"name": name, "method": "POST", "path": path, "body": b}
    if status:
        c["status"] = status
    c.update(kw)
    cases.append(c)


def chat(name, extra, status=None):
    body(name, "{" + MSG + "," + extra + "}", status=status)


def raw(name, text, status=None, **kw):
    c = {"name": name, "raw": text}
    if status:
        c["status"] = status
    c.update(kw)
    cases.append(c)


# --- bad JSON ---
for i, b in enumerate(["", "{", "}", "[", "nul", "{\"messages\":", "{'messages':[]}", "{\"messages\":[],}",
                       "{" + MSG + "}garbage", "{\"temperature\":NaN," + MSG + "}", "{\"n\":Infinity," + MSG + "}",
                       "/*c*/{" + MSG + "}", "{\"temperature\":1e999," + MSG + "}", "{\"a\":\"unterminated}",
                       "{\"a\":\"ctl\x01char\"," + MSG + "}", "[" + "{" + MSG + "}" + "]", "\"just a string\"", "42",
                       "null", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"]):
    body("bad_json_%d" % i, b, status=400)
# --- wrong types / out of range (chat) ---
for name, extra in [
    ("n_string", '"n":"2"'), ("n_float", '"n":1.5'), ("n_zero", '"n":0'), ("n_negative", '"n":-3'),
    ("n_huge", '"n":1000000000'), ("n_nine", '"n":9'), ("max_tokens_neg", '"max_tokens":-1'),
    ("max_tokens_zero", '"max_tokens":0'), ("max_tokens_str", '"max_tokens":"10"'),
    ("max_tokens_1e20", '"max_tokens":1e20'), ("max_tokens_ctx", '"max_tokens":5000'),
    ("max_tokens_int_max", '"max_tokens":2147483648'), ("max_completion_tokens_neg", '"max_completion_tokens":-7'),
    ("temperature_str", '"temperature":"hot"'), ("temperature_neg", '"temperature":-1'),
    ("temperature_big", '"temperature":3'), ("temperature_array", '"temperature":[1]'),
    ("top_p_zero", '"top_p":0'), ("top_p_big", '"top_p":2'), ("top_k_neg", '"top_k":-5'), ("top_k_str", '"top_k":"x"'),
    ("min_p_neg", '"min_p":-0.1'), ("min_p_big", '"min_p":1.5'), ("seed_str", '"seed":"abc"'),
    ("seed_float", '"seed":1.5'), ("seed_huge", '"seed":1e30'), ("stop_number", '"stop":123'),
    ("stop_int_array", '"stop":[1,2]'), ("stop_17", '"stop":[' + ",".join('"s%d"' % i for i in range(17)) + ']'),
    ("stop_empty_entry", '"stop":[""]'), ("stop_long_entry", '"stop":["' + "x" * 300 + '"]'),
    ("stop_nested", '"stop":[["a"]]'),
    ("logprobs_str", '"logprobs":"true"'), ("top_logprobs_21", '"logprobs":true,"top_logprobs":21'),
    ("top_logprobs_neg", '"logprobs":true,"top_logprobs":-1'), ("top_logprobs_alone", '"top_logprobs":2'),
    ("presence_big", '"presence_penalty":5'), ("presence_neg", '"presence_penalty":-5'),
    ("frequency_big", '"frequency_penalty":3'), ("repetition_zero", '"repetition_penalty":0'),
    ("repetition_neg", '"repetition_penalty":-1'), ("repetition_huge", '"repetition_penalty":100'),
    ("stream_str", '"stream":"yes"'), ("stream_options_nostream", '"stream_options":{"include_usage":true}'),
    ("stream_options_str", '"stream":true,"stream_options":"x"'),
    ("include_usage_str", '"stream":true,"stream_options":{"include_usage":"y"}'),
    ("tools_object", '"tools":{}'), ("tools_number", '"tools":5'), ("tools_entry_str", '"tools":["f"]'),
    ("tools_no_function", '"tools":[{"type":"function"}]'),
    ("tools_empty_name", '"tools":[{"type":"function","function":{"name":""}}]'),
    ("tools_name_number", '"tools":[{"type":"function","function":{"name":5}}]'),
    ("tools_params_array", '"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]'),
    ("tools_bad_type", '"tools":[{"type":"code","function":{"name":"f"}}]'),
    ("tools_200", '"tools":[' + ",".join('{"type":"function","function":{"name":"f%d"}}' % i for i in range(200)) + ']'),
    ("tool_choice_bad", '"tool_choice":"sometimes"'), ("tool_choice_number", '"tool_choice":1'),
    ("tool_choice_unknown_fn", '"tools":[{"type":"function","function":{"name":"f"}}],'
                               '"tool_choice":{"type":"function","function":{"name":"g"}}'),
    ("tool_choice_required_no_tools", '"tool_choice":"required"'),
    ("reasoning_effort_bad", '"reasoning_effort":"extreme"'), ("reasoning_effort_num", '"reasoning_effort":5'),
    ("template_kwargs_str", '"chat_template_kwargs":"x"'), ("template_kwargs_thinking_str",
                                                             '"chat_template_kwargs":{"thinking":"no"}'),
    ("thinking_str", '"thinking":"no"'), ("user_number", '"user":5'), ("ignore_eos_str", '"ignore_eos":"x"'),
    ("stop_token_ids_neg", '"stop_token_ids":[-1]'), ("stop_token_ids_oov", '"stop_token_ids":[99999999]'),
    ("model_number", '"model":5'),
]:
    chat("chat_" + name, extra, status=400)
chat("chat_model_unknown", '"model":"gpt-4"', status=404)
# --- messages ---
for name, msgs in [
    ("missing", None), ("empty", "[]"), ("string", '"hi"'), ("number", "5"), ("null", "null"), ("object", "{}"),
    ("entry_number", "[1]"), ("role_missing", '[{"content":"x"}]'), ("role_number", '[{"role":1,"content":"x"}]'),
    ("role_bad", '[{"role":"robot","content":"x"}]'), ("content_missing", '[{"role":"user"}]'),
    ("content_number", '[{"role":"user","content":5}]'), ("content_bool", '[{"role":"user","content":true}]'),
    ("content_object", '[{"role":"user","content":{}}]'), ("part_number", '[{"role":"user","content":[1]}]'),
    ("part_type_bad", '[{"role":"user","content":[{"type":"audio"}]}]'),
    ("part_text_missing", '[{"role":"user","content":[{"type":"text"}]}]'),
    ("part_image_no_url", '[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]'),
    ("part_image_empty_url", '[{"role":"user","content":[{"type":"image_url","image_url":{"url":""}}]}]'),
    ("part_image_bad_detail",
     '[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,","detail":"ultra"}}]}]'),
    ("part_image_number", '[{"role":"user","content":[{"type":"image_url","image_url":5}]}]'),
    ("parts_600", '[{"role":"user","content":[' + ",".join(['{"type":"text","text":"a"}'] * 600) + ']}]'),
    ("tool_calls_on_user", '[{"role":"user","content":"x","tool_calls":[]}]'),
    ("tool_calls_not_array", '[{"role":"assistant","tool_calls":{}}]'),
    ("tool_call_no_name", '[{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}]'),
    ("tool_msg_no_id", '[{"role":"tool","content":"x"}]'),
    ("image_unsupported", '[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}]}]'),
]:
    b = "{}" if msgs is None else '{"messages":' + msgs + "}"
    body("messages_" + name, b, status=400)
# --- invalid UTF-8 ---
for name, bad in [("ff", "ff"), ("overlong", "c0af"), ("truncated", "e282"), ("surrogate", "eda080"),
                  ("cont_only", "80"), ("five_byte", "f888808080")]:
    pre = ('{"messages":[{"role":"user","content":"a').encode().hex()
    cases.append({"name": "utf8_content_" + name, "method": "POST", "path": CHAT,
                  "body_hex": pre + bad + '"}]}'.encode().hex(), "status": 400})
cases.append({"name": "utf8_stop", "method": "POST", "path": CHAT, "status": 400,
              "body_hex": ('{' + MSG + ',"stop":["').encode().hex() + "fe" + '"]}'.encode().hex()})
chat("utf8_lone_surrogate_escape", '"stop":["\\ud800"]', status=400)
# --- absurd sizes ---
cases.append({"name": "stop_100k", "method": "POST", "path": CHAT, "status": 400,
              "body_repeat": ["{" + MSG + ',"stop":["a"', ',"a"', 99999, "]}"]})
cases.append({"name": "messages_5000", "method": "POST", "path": CHAT, "status": 400,
              "body_repeat": ['{"messages":[{"role":"user","content":"a"}', ',{"role":"user","content":"a"}', 4999, "]}"]})
body("deep_nesting_100", "{" + MSG + ',"x":' + "[" * 100 + "]" * 100 + "}", status=400)
cases.append({"name": "deep_nesting_100k", "method": "POST", "path": CHAT, "status": 400,
              "body_repeat": ["{" + MSG + ',"x":', "[", 100000, ""]})
cases.append({"name": "prompt_over_context", "method": "POST", "path": CHAT, "status": 400,
              "body_repeat": ['{"messages":[{"role":"user","content":"', "hello ", 5000, '"}]}']})
cases.append({"name": "body_2mib", "method": "POST", "path": CHAT, "status": 413,
              "body_repeat": ['{"messages":[{"role":"user","content":"', "a", 2 << 20, '"}]}']})
# --- completions / tokenize / detokenize ---
for name, b in [("no_prompt", "{}"), ("empty_prompt", '{"prompt":""}'), ("empty_ids", '{"prompt":[]}'),
                ("neg_id", '{"prompt":[-1]}'), ("float_id", '{"prompt":[1.5]}'), ("oov_id", '{"prompt":[99999999]}'),
                ("huge_id", '{"prompt":[1099511627776]}'), ("batch", '{"prompt":["a","b"]}'),
                ("number", '{"prompt":5}'), ("object", '{"prompt":{}}'), ("logprobs_bool", '{"prompt":"a","logprobs":true}'),
                ("logprobs_21", '{"prompt":"a","logprobs":21}'), ("echo_str", '{"prompt":"a","echo":"x"}'),
                ("n_zero", '{"prompt":"a","n":0}')]:
    body("completions_" + name, b, path="/v1/completions", status=400)
for name, b in [("number", '{"prompt":1}'), ("missing", "{}"), ("messages_bad", '{"messages":5}')]:
    body("tokenize_" + name, b, path="/tokenize", status=400)
for name, b in [("string", '{"tokens":"x"}'), ("neg", '{"tokens":[-1]}'), ("huge", '{"tokens":[1e10]}'),
                ("oov", '{"tokens":[99999999]}'), ("missing", "{}")]:
    body("detokenize_" + name, b, path="/detokenize", status=400)
# --- content types ---
for ct in ["text/plain", "multipart/form-data; boundary=x", "application/x-www-form-urlencoded", "image/png"]:
    body("content_type_" + ct.split(";")[0].replace("/", "_"), "{" + MSG + "}", status=415,
         headers=[["Content-Type", ct]])
# --- methods and paths ---
for name, m, p, st in [("get_chat", "GET", CHAT, 405), ("put_chat", "PUT", CHAT, 405), ("delete_models", "DELETE", "/v1/models", 405),
                       ("post_health", "POST", "/health", 405), ("patch_completions", "PATCH", "/v1/completions", 405),
                       ("brew", "BREW", CHAT, 405), ("unknown_path", "GET", "/v2/whatever", 404),
                       ("double_slash", "POST", "/" + CHAT, 404), ("dotdot", "GET", "/v1/../v1/models", 404),
                       ("encoded_slash", "GET", "/v1%2Fmodels", 404), ("options", "OPTIONS", CHAT, 405)]:
    raw("method_" + name, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n" % (m, p), status=st)
# --- broken HTTP framing ---
for name, text in [
    ("garbage_line", "GARBAGE\r\n\r\n"), ("no_target", "GET\r\n\r\n"), ("bad_version", "GET / HTTP/9.9\r\n\r\n"),
    ("header_no_colon", "GET /health HTTP/1.1\r\nHost x\r\n\r\n"), ("header_space_name", "GET /health HTTP/1.1\r\nBad Name: x\r\n\r\n"),
    ("binary_junk", "\x00\x01\x02\x03\xff\xfe\r\n\r\n"), ("space_in_target", "GET /a b HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("cl_alpha", "POST " + CHAT + " HTTP/1.1\r\nContent-Length: abc\r\n\r\n"),
    ("cl_negative", "POST " + CHAT + " HTTP/1.1\r\nContent-Length: -1\r\n\r\n"),
    ("cl_duplicate", "POST " + CHAT + " HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"),
    ("cl_huge", "POST " + CHAT + " HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n{}"),
    ("cl_overflow", "POST " + CHAT + " HTTP/1.1\r\nContent-Length: 999999999999999999999999\r\n\r\n"),
    ("te_gzip", "POST " + CHAT + " HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"),
    ("chunk_bad_hex", "POST " + CHAT + " HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"),
    ("chunk_overflow", "POST " + CHAT + " HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\n"),
    ("chunk_no_crlf", "POST " + CHAT + " HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n"),
    ("chunk_invalid_json", "POST " + CHAT + " HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n0\r\n\r\n"),
    ("expect_continue_huge", "POST " + CHAT + " HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 50000000\r\n\r\n"),
    ("http10_no_body", "POST " + CHAT + " HTTP/1.0\r\n\r\n"),
]:
    raw("http_" + name, text)
raw("http_chunks_over_limit", "POST " + CHAT + " HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
    raw_repeat=["1\r\na\r\n", 1100000, "0\r\n\r\n"], status=413)
raw("header_64k", "GET /v1/models HTTP/1.1\r\nX-Big: ", raw_repeat=["a", 65536, "\r\n\r\n"], status=431)
cases.append({"name": "headers_10k", "method": "GET", "path": "/v1/models", "header_repeat": ["X-A", "b", 10000],
              "status": 431})
cases.append({"name": "headers_150", "method": "GET", "path": "/v1/models", "header_repeat": ["X-A", "b", 150],
              "status": 431})

with open("cases.jsonl", "w") as f:
    for c in cases:
        f.write(json.dumps(c) + "\n")
print(len(cases), "cases")
