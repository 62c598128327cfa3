-- Wireshark Lua dissector for MRC 1.0 (Multipath Reliable Connection), from openmrc.
--
-- Usage:   wireshark -X lua_script:mrc.lua capture.pcap
--          tshark -X lua_script:mrc.lua -o mrc.udp_port:4971 -r capture.pcap
-- or copy this file into the personal Lua plugins folder (Help > About > Folders).
--
-- Layouts follow openmrc/wire/_layouts.py (the authoritative byte/bit layout, explained in headers.py) and
-- the header chain of openmrc/wire/packet.py: BTH, then by opcode
--   0xC6-0xCB data  METH, [TSETH if BTH.TS], RETH, [ImmDt for 0xC9/0xCB], payload, pad
--   0xD1 ACK        AETH
--   0xD8 / 0xD9     ERTH / EETH   (endpoint request / response)
--   0xDC SACK       SETH, CC_STATE
--   0xDD NACK       NETH
--   0xDE PROBE      PETH
-- and the 4-byte ICRC trailer (shown as mrc.icrc, read little-endian as RoCEv2 stores it).
-- [openmrc] A packet of an authenticated QP (BTH byte 8 bit S, mrc.bth.sealed) carries a security
-- trailer before the ICRC (openmrc/wire/security.py): a data packet's header tag if SECH's H says so
-- (mrc.sech.header_tag), SECH (mrc.sech.*) and the tag (mrc.sech.tag), the last two always the last 32
-- bytes before the ICRC. Wireshark's Lua API has no AES-GCM, so the tags are
-- shown, not verified: `openmrc decode --key KEYFILE --src-qpn N` verifies them.
--
-- Field names are mrc.<header>.<python attribute>, except mrc.reth.va/rkey/dmalen, mrc.imm and mrc.icrc.
-- Loading this script registers MRC on UDP port 4791 (preference mrc.udp_port), which displaces the
-- built-in RRoCE (InfiniBand) dissector on that port while the script is loaded.

local DEFAULT_PORT = 4791
local ICRC_SIZE = 4

local mrc = Proto("mrc", "MRC (Multipath Reliable Connection)")

---------------------------------------------------------------------------------------------------------
-- Code points (openmrc/wire/constants.py)
---------------------------------------------------------------------------------------------------------
local OPCODES = {
    [0xC6] = "WRITE_FIRST",
    [0xC7] = "WRITE_MIDDLE",
    [0xC8] = "WRITE_LAST",
    [0xC9] = "WRITE_LAST_WITH_IMM",
    [0xCA] = "WRITE_ONLY",
    [0xCB] = "WRITE_ONLY_WITH_IMM",
    [0xD1] = "ACK",
    [0xD8] = "EP_REQUEST",
    [0xD9] = "EP_RESPONSE",
    [0xDC] = "SACK",
    [0xDD] = "NACK",
    [0xDE] = "PROBE",
}
local NACK_REASONS = {
    [0x01] = "TRIMMED",
    [0x02] = "TRIMMED_LASTHOP",
    [0x06] = "NO_BITMAP",
    [0x07] = "NO_PKT_BUFFER",
    [0x0A] = "NO_RESOURCE",
    [0x0B] = "PSN_OOR_WINDOW",
    [0x19] = "UNEXP_EVENT",
}
local SACK_M = { [0] = "NONE", [1] = "SKIP_ONCE", [2] = "ALWAYS_SKIP", [3] = "reserved" }
local EP_OPS = { [0] = "PORT_STATUS_UPDATE", [1] = "EV_PROBE" }
local AETH_SYNDROMES = {
    [0x00] = "ACK",
    [0x60] = "NAK_PSN_SEQUENCE_ERROR",
    [0x61] = "NAK_INVALID_REQUEST",
    [0x62] = "NAK_REMOTE_ACCESS_ERROR",
    [0x63] = "NAK_REMOTE_OPERATIONAL_ERROR",
}
local TSR_UNITS = { [0] = "128 ns", [1] = "1.024 us" }

local function is_data(op) return op >= 0xC6 and op <= 0xCB end
local function is_imm(op) return op == 0xC9 or op == 0xCB end

---------------------------------------------------------------------------------------------------------
-- Header layouts. Each field: { name, label, byte offset, byte length, mask=, base=, vals=, bool=,
-- signed=, abbr= }. ``len`` is the width of the containing integer (1, 2, 3, 4 or 8 bytes); ``mask``
-- selects sub-byte fields inside it, exactly as in _layouts.py.
---------------------------------------------------------------------------------------------------------
local function typenext()
    return {
        { "hdr_type", "Header type", 0, 1, mask = 0xF0 },
        { "next_hdr", "Next header", 0, 1, mask = 0x0F },
    }
end

local function extend(list, more)
    for _, f in ipairs(more) do list[#list + 1] = f end
    return list
end

local function ts_tail(off)  -- TSR(15) resv(14:4) format_type(3:0)
    return {
        { "tsr", "Timestamp resolution (TSR)", off, 2, mask = 0x8000, vals = TSR_UNITS },
        { "format_type", "Format type", off, 2, mask = 0x000F },
    }
end

local HEADERS = {
    { key = "bth", title = "Base Transport Header (BTH)", size = 12, fields = {
        { "opcode", "Opcode", 0, 1, base = base.HEX, vals = OPCODES },
        { "se", "Solicited event (SE)", 1, 1, mask = 0x80, bool = true },
        { "m", "MigReq (M)", 1, 1, mask = 0x40, bool = true },
        { "pad", "Pad count", 1, 1, mask = 0x30 },
        { "tver", "Transport header version", 1, 1, mask = 0x0F },
        { "p_key", "Partition key", 2, 2, base = base.HEX },
        { "fecn", "FECN", 4, 1, mask = 0x80, bool = true },
        { "becn", "BECN", 4, 1, mask = 0x40, bool = true },
        { "dest_qp", "Destination QP", 5, 3, base = base.HEX },
        { "ack_req", "Acknowledge request (A)", 8, 1, mask = 0x80, bool = true },
        { "sealed", "Sealed: security trailer (S) [openmrc]", 8, 1, mask = 0x40, bool = true },
        { "rtx", "Retransmission (RTX)", 8, 1, mask = 0x20, bool = true },
        { "ts", "TSETH present (TS)", 8, 1, mask = 0x10, bool = true },
        { "psn", "Packet sequence number", 9, 3 },
    } },
    { key = "meth", title = "MRC Extended Transport Header (METH)", size = 4, fields = {
        { "rqmsn", "RQ message sequence number", 0, 2 },
        { "msn", "Message sequence number", 2, 2 },
    } },
    { key = "tseth", title = "Timestamp Extended Transport Header (TSETH)", size = 4, fields = extend({
        { "tx_timestamp", "TX timestamp", 0, 2, base = base.HEX },
    }, ts_tail(2)) },
    { key = "reth", title = "RDMA Extended Transport Header (RETH)", size = 16, fields = {
        { "va", "Virtual address", 0, 8, base = base.HEX },
        { "rkey", "Remote key", 8, 4, base = base.HEX },
        { "dmalen", "DMA length", 12, 4 },
    } },
    { key = "imm", title = nil, size = 4, fields = {  -- ImmDt: a single field, no subtree
        { "imm", "Immediate data", 0, 4, base = base.HEX, abbr = "mrc.imm" },
    } },
    { key = "aeth", title = "ACK Extended Transport Header (AETH)", size = 4, fields = {
        { "syndrome", "Syndrome", 0, 1, base = base.HEX, vals = AETH_SYNDROMES },
        { "msn", "Message sequence number", 1, 3 },
    } },
    { key = "seth", title = "Selective ACK Extended Transport Header (SETH)", size = 28, fields = extend(typenext(), {
        { "m", "Path feedback (M)", 1, 1, mask = 0xC0, vals = SACK_M },
        { "pr", "PR", 1, 1, mask = 0x20, bool = true },
        { "ack_psn_offset", "ACK PSN offset", 2, 2, signed = true },
        { "entropy", "Entropy (EV echo)", 4, 4, base = base.HEX },
        { "src_qp", "Source QP", 8, 2, base = base.HEX },
        { "dst_qp", "Destination QP", 10, 2, base = base.HEX },
        { "svc", "Service time code (openmrc: m << 2e us)", 12, 1, base = base.HEX },
        { "cack_psn", "Cumulative ACK PSN", 13, 3 },
        { "cc_type", "CC type", 16, 1, mask = 0xF0 },
        { "cc_flags", "CC flags", 16, 1, mask = 0x0F, base = base.HEX },
        { "mpr", "MPR (128-PSN units)", 17, 1 },
        { "sack_offset", "SACK offset", 18, 2, signed = true },
        { "bitmap", "SACK bitmap", 20, 8, base = base.HEX },
    }) },
    { key = "ccstate", title = "Congestion Control State (CC_STATE)", size = 8, fields = {
        { "ts_echo", "Timestamp echo", 0, 2, base = base.HEX },
        { "ooo_count", "Out-of-order count", 2, 2, mask = 0x7FFF },
        { "r_c", "Restore cwnd (R_C)", 4, 1, mask = 0x80, bool = true },
        { "rcv_cwnd_pen", "Receiver cwnd penalty", 4, 1, mask = 0x7F },
        { "rcvd_256b", "Received bytes (256 B units)", 5, 3 },
    } },
    { key = "neth", title = "NACK Extended Transport Header (NETH)", size = 20, fields = extend(typenext(), {
        { "reason", "NACK reason", 2, 1, base = base.HEX, vals = NACK_REASONS },
        { "vendor_info", "Vendor info", 3, 1, base = base.HEX },
        { "entropy", "Entropy (EV echo)", 4, 4, base = base.HEX },
        { "src_qp", "Source QP", 8, 2, base = base.HEX },
        { "dst_qp", "Destination QP", 10, 2, base = base.HEX },
        { "psn", "NACK PSN", 13, 3 },
        { "cc_type", "CC type", 16, 1, mask = 0xF0 },
        { "cc_flags", "CC flags", 16, 1, mask = 0x0F, base = base.HEX },
        { "ts_echo", "Timestamp echo", 18, 2, base = base.HEX },
    }) },
    { key = "peth", title = "Probe Extended Transport Header (PETH)", size = 16, fields = extend(extend(typenext(), {
        { "vendor_info", "Vendor info", 3, 1, base = base.HEX },
        { "probe_id", "Probe id", 4, 2 },
        { "src_qp", "Source QP", 8, 2, base = base.HEX },
        { "dst_qp", "Destination QP", 10, 2, base = base.HEX },
        { "tx_timestamp", "TX timestamp", 12, 2, base = base.HEX },
    }), ts_tail(14)) },
    { key = "erth", title = "Endpoint Request Transport Header (ERTH)", size = 16, fields = extend(extend(typenext(), {
        { "op", "Endpoint operation", 1, 1, mask = 0x03, vals = EP_OPS },
        { "vendor_info", "Vendor info", 3, 1, base = base.HEX },
        { "port_status", "Port status mask", 4, 4, base = base.HEX },
        { "tx_timestamp", "TX timestamp", 12, 2, base = base.HEX },
    }), ts_tail(14)) },
    { key = "sech", title = "Security Extension Header (SECH) [openmrc]", size = 16, fields = {
        { "version", "Version", 0, 1, mask = 0xF0 },
        { "encrypted", "Payload encrypted (E)", 0, 1, mask = 0x01, bool = true },
        { "has_header_tag", "Header tag present (H)", 0, 1, mask = 0x02, bool = true },
        { "wants_header_tag", "Wants header tags (W)", 0, 1, mask = 0x04, bool = true },
        { "epoch", "Key epoch", 1, 1 },
        { "sdi", "Security domain (SDI)", 2, 4 },
        { "ssi", "Secure source identifier (SSI)", 6, 4, base = base.HEX },
    } },
    { key = "eeth", title = "Endpoint Response Transport Header (EETH)", size = 36, fields = extend(extend(typenext(), {
        { "op", "Endpoint operation", 1, 1, mask = 0x30, vals = EP_OPS },
        { "vendor_info", "Vendor info", 3, 1, base = base.HEX },
        { "service_time", "Service time (ns)", 4, 4 },
        { "port_status", "Port status mask", 8, 4, base = base.HEX },
        { "rx_port", "Receive port", 12, 1 },
        { "ts_echo", "Timestamp echo", 28, 2, base = base.HEX },
    }), ts_tail(30)) },
}

local HDR = {}  -- key -> header definition
local UINT_BY_LEN = { [1] = "uint8", [2] = "uint16", [3] = "uint24", [4] = "uint32", [8] = "uint64" }
local INT_BY_LEN = { [1] = "int8", [2] = "int16", [3] = "int24", [4] = "int32", [8] = "int64" }

local function mask_shift(mask)
    local s = 0
    while bit32.band(mask, 1) == 0 do
        mask = bit32.rshift(mask, 1)
        s = s + 1
    end
    return s
end

local pfields = {}
for _, h in ipairs(HEADERS) do
    HDR[h.key] = h
    if h.title then
        h.pf = ProtoField.none("mrc." .. h.key, h.title)
        pfields[#pfields + 1] = h.pf
    end
    for _, f in ipairs(h.fields) do
        local name, label, len = f[1], f[2], f[4]
        local abbr = f.abbr or ("mrc." .. h.key .. "." .. name)
        if f.bool then
            f.pf = ProtoField.bool(abbr, label, len * 8, nil, f.mask)
        elseif f.signed then
            f.pf = ProtoField[INT_BY_LEN[len]](abbr, label, base.DEC, f.vals, f.mask)
        else
            f.pf = ProtoField[UINT_BY_LEN[len]](abbr, label, f.base or base.DEC, f.vals, f.mask)
        end
        f.shift = f.mask and mask_shift(f.mask) or 0
        pfields[#pfields + 1] = f.pf
    end
end

local pf_payload = ProtoField.bytes("mrc.payload", "Payload")
local pf_padding = ProtoField.bytes("mrc.padding", "Pad bytes")
local pf_undecoded = ProtoField.bytes("mrc.undecoded", "Undecoded bytes")
local pf_icrc = ProtoField.uint32("mrc.icrc", "ICRC", base.HEX)
local pf_sech_counter = ProtoField.uint64("mrc.sech.counter", "Counter (40 bits)")
local pf_htag = ProtoField.bytes("mrc.sech.header_tag", "Header tag (AES-GCM)")
local pf_tag = ProtoField.bytes("mrc.sech.tag", "Tag (AES-GCM)")
-- Wireshark's checksum status convention (PROTO_CHECKSUM_E_*): what `xxx.checksum.status` fields hold.
local ICRC_BAD, ICRC_GOOD, ICRC_UNVERIFIED = 0, 1, 2
local pf_icrc_status = ProtoField.uint8("mrc.icrc.status", "ICRC status", base.DEC,
    { [ICRC_BAD] = "Bad", [ICRC_GOOD] = "Good", [ICRC_UNVERIFIED] = "Unverified" })
local pf_icrc_computed = ProtoField.uint32("mrc.icrc.computed", "Computed ICRC", base.HEX)
extend(pfields, { pf_payload, pf_padding, pf_undecoded, pf_icrc, pf_icrc_status, pf_icrc_computed,
    pf_sech_counter, pf_htag, pf_tag })
mrc.fields = pfields

local ex_truncated = ProtoExpert.new("mrc.truncated", "Truncated MRC packet",
    expert.group.MALFORMED, expert.severity.ERROR)
local ex_opcode = ProtoExpert.new("mrc.unknown_opcode", "Unknown or reserved MRC opcode",
    expert.group.UNDECODED, expert.severity.WARN)
local ex_malformed = ProtoExpert.new("mrc.malformed", "Malformed MRC packet",
    expert.group.MALFORMED, expert.severity.WARN)
local ex_internal = ProtoExpert.new("mrc.internal_error", "MRC dissector internal error",
    expert.group.MALFORMED, expert.severity.ERROR)
local ex_icrc = ProtoExpert.new("mrc.icrc.bad", "Bad ICRC", expert.group.CHECKSUM, expert.severity.ERROR)
mrc.experts = { ex_truncated, ex_opcode, ex_malformed, ex_internal, ex_icrc }

mrc.prefs.udp_port = Pref.uint("UDP port", DEFAULT_PORT,
    "UDP destination port of MRC (4791, the RoCEv2 port, by default; some sources use 4971)")
mrc.prefs.check_icrc = Pref.bool("Verify the ICRC", true,
    "Compute each packet's RoCEv2 invariant CRC over its inner IP packet and compare it with the trailer")

---------------------------------------------------------------------------------------------------------
-- ICRC (RoCEv2, IBTA Annex A17; openmrc/wire/icrc.py): CRC-32 (the Ethernet polynomial, as zlib) over
-- 8 bytes of 0xFF, the inner IP header with its variant fields set to ones (IPv4: TOS, TTL, checksum;
-- IPv6: traffic class, flow label, hop limit), the UDP header with its checksum set to ones, BTH with
-- byte 4 set to ones, and the rest up to the trailer, stored least-significant byte first.
---------------------------------------------------------------------------------------------------------
local CRC_TABLE = {}
for i = 0, 255 do
    local c = i
    for _ = 1, 8 do
        if bit32.band(c, 1) == 1 then c = bit32.bxor(0xEDB88320, bit32.rshift(c, 1)) else c = bit32.rshift(c, 1) end
    end
    CRC_TABLE[i] = c
end

local function crc_update(crc, bytes)
    local band, bxor, rshift, byte = bit32.band, bit32.bxor, bit32.rshift, string.byte
    for i = 1, #bytes do
        crc = bxor(rshift(crc, 8), CRC_TABLE[band(bxor(crc, byte(bytes, i)), 0xFF)])
    end
    return crc
end

-- `s` with the 1-based positions in `ones` replaced by 0xFF bytes.
local function masked(s, ones)
    local b = { s:byte(1, -1) }
    for _, i in ipairs(ones) do b[i] = 0xFF end
    return string.char(table.unpack(b))
end

local f_ip, f_ipv6, f_udp = Field.new("ip"), Field.new("ipv6"), Field.new("udp")

-- The header of protocol field `f` that ends nearest before `before` (the innermost under the UDP header).
local function innermost(f, before)
    local best
    for _, fi in ipairs({ f() }) do
        if fi.offset < before and (best == nil or fi.offset > best.offset) then best = fi end
    end
    return best
end

-- The ICRC the MRC packet in `tvb` (its whole UDP payload, trailer included) must carry, or nil when the
-- IP and UDP headers around it are not at hand.
local function computed_icrc(tvb)
    local udp = innermost(f_udp, math.huge)
    if not udp or udp.len < 8 then return nil end
    local ip4, ip6 = innermost(f_ip, udp.offset), innermost(f_ipv6, udp.offset)
    local ip
    if ip4 and (not ip6 or ip4.offset > ip6.offset) then
        ip = masked(ip4.range:raw(), { 2, 9, 11, 12 })
    elseif ip6 and ip6.len >= 40 then
        ip = masked(ip6.range:raw(0, 40), { 2, 3, 4, 8 })
        ip = string.char(0x6F) .. ip:sub(2)
    else
        return nil
    end
    local crc = crc_update(0xFFFFFFFF, string.rep("\255", 8) .. ip .. masked(udp.range:raw(0, 8), { 7, 8 }))
    local body = tvb:raw(0, tvb:len() - ICRC_SIZE)
    crc = crc_update(crc, masked(body:sub(1, 12), { 5 }) .. body:sub(13))
    return bit32.bnot(crc)
end

---------------------------------------------------------------------------------------------------------
-- Dissection
---------------------------------------------------------------------------------------------------------

-- Add header `key` at `off` if it fits before `limit`; returns a table of its decoded values (fields
-- that do not fit in 32 bits are left out) or nil after flagging the truncation.
local function add_header(key, tvb, off, limit, tree)
    local h = HDR[key]
    local name = h.title and h.title:match("%((.-)%)") or "ImmDt"
    if off + h.size > limit then
        tree:add_proto_expert_info(ex_truncated, string.format(
            "Truncated %s: needs %d bytes at offset %d, %d available", name, h.size, off, math.max(limit - off, 0)))
        return nil
    end
    local range = tvb(off, h.size)
    local sub = h.pf and tree:add(h.pf, range) or tree
    local vals = {}
    for _, f in ipairs(h.fields) do
        local r = range(f[3], f[4])
        sub:add(f.pf, r)
        if f[4] <= 4 then
            local v = f.signed and r:int() or r:uint()
            if f.mask then v = bit32.rshift(bit32.band(v, f.mask), f.shift) end
            if f.bool then v = v ~= 0 end  -- Lua: 0 is true, so flags become booleans
            vals[f[1]] = v
        end
    end
    return vals, sub
end

local function name_of(tbl, v, fmt)
    return tbl[v] or string.format(fmt or "0x%02x", v)
end

-- List the PSNs a SACK bitmap reports as received (bit i, LSB first, = PSN base + i).
local function sacked_psns(range, base_psn)
    local bm = range:uint64()
    local psns = {}
    for i = 0, 63 do
        if bm:band(UInt64(1)):tonumber() == 1 then
            psns[#psns + 1] = tostring(bit32.band(base_psn + i, 0xFFFFFF))
        end
        bm = bm:rshift(1)
    end
    return psns
end

local function dissect(tvb, pinfo, root)
    local len = tvb:len()
    pinfo.cols.protocol = "MRC"
    local tree = root:add(mrc, tvb())

    -- The ICRC is the last 4 bytes of the UDP payload, if the whole payload was captured.
    local limit = len
    local icrc_ok = len == tvb:reported_len() and len >= 12 + ICRC_SIZE
    if icrc_ok then
        limit = len - ICRC_SIZE
    elseif len ~= tvb:reported_len() then
        tree:add_proto_expert_info(ex_truncated, string.format(
            "Capture holds %d of %d bytes: ICRC not captured", len, tvb:reported_len()))
    else
        tree:add_proto_expert_info(ex_truncated, string.format(
            "%d bytes is shorter than BTH + ICRC (16 bytes)", len))
    end

    local bth = add_header("bth", tvb, 0, limit, tree)
    if not bth then
        pinfo.cols.info = "MRC [truncated]"
        return
    end
    local op = bth.opcode
    local opname = name_of(OPCODES, op)
    -- [openmrc] a sealed packet's security trailer sits between its last header (or pad) and the ICRC
    local sech_off, htag_off
    if bth.sealed then
        if limit - 12 >= 32 then
            sech_off = limit - 32
            limit = sech_off
            if bit32.band(tvb(sech_off, 1):uint(), 0x02) ~= 0 and limit - 12 >= 16 then
                htag_off = limit - 16
                limit = htag_off
            end
        else
            tree:add_proto_expert_info(ex_truncated, string.format(
                "Sealed (S) but %d bytes leave no room for the security trailer", limit - 12))
        end
    end
    local info = string.format("MRC %s QP=0x%06x PSN=%d", opname, bth.dest_qp, bth.psn)
    tree:append_text(string.format(", %s, QP 0x%06x, PSN %d", opname, bth.dest_qp, bth.psn))
    local off = 12

    local function need(key)
        local v, sub = add_header(key, tvb, off, limit, tree)
        if v then off = off + HDR[key].size end
        return v, sub
    end

    local ok_chain = true
    if is_data(op) then
        ok_chain = need("meth") and (not bth.ts or need("tseth")) and need("reth")
            and (not is_imm(op) or need("imm")) and true or false
        if ok_chain then
            local rest = limit - off
            -- Pad bytes sit just before the ICRC: only there if the whole packet was captured.
            local n = icrc_ok and rest - bth.pad or rest
            if n < 0 then
                tree:add_proto_expert_info(ex_malformed, string.format(
                    "Pad %d but only %d bytes follow the headers (trimmed packet?)", bth.pad, rest))
                n = rest
            end
            if n > 0 then tree:add(pf_payload, tvb(off, n)):append_text(string.format(" (%d bytes)", n)) end
            if rest > n then tree:add(pf_padding, tvb(off + n, rest - n)) end
            off = limit
            if bth.rtx then info = info .. " [RTX]" end
            if bth.ack_req then info = info .. " [A]" end
            info = info .. string.format(" len=%d", n)
        end
    elseif op == 0xD1 then
        local aeth = need("aeth")
        ok_chain = aeth ~= nil
        if aeth then
            local syn = aeth.syndrome == 0 and "" or (name_of(AETH_SYNDROMES, aeth.syndrome) .. " ")
            info = string.format("MRC ACK %smsn=%d QP=0x%06x", syn, aeth.msn, bth.dest_qp)
        end
    elseif op == 0xDC then
        local seth_off = off
        local seth, sub = need("seth")
        local cc = seth and need("ccstate")
        ok_chain = cc ~= nil
        if seth then
            if seth.m == 3 then
                sub:add_proto_expert_info(ex_malformed, "Reserved SACK M value 3")
            end
            local base_psn = seth.cack_psn + seth.sack_offset
            sub:add(string.format("Triggering PSN: %d", bit32.band(seth.cack_psn + seth.ack_psn_offset, 0xFFFFFF)))
                :set_generated()
            local psns = sacked_psns(tvb(seth_off + 20, 8), base_psn)
            sub:add(string.format("SACKed PSNs: %s", #psns > 0 and table.concat(psns, ", ") or "none"))
                :set_generated()
            info = string.format("MRC SACK cack=%d ack_psn=%d QP=0x%06x", seth.cack_psn,
                bit32.band(seth.cack_psn + seth.ack_psn_offset, 0xFFFFFF), bth.dest_qp)
            if seth.m ~= 0 then info = info .. " M=" .. SACK_M[seth.m] end
            if #psns > 0 then info = info .. " sacked=" .. table.concat(psns, ",") end
        end
    elseif op == 0xDD then
        local neth = need("neth")
        ok_chain = neth ~= nil
        if neth then
            info = string.format("MRC NACK %s psn=%d QP=0x%06x", name_of(NACK_REASONS, neth.reason), neth.psn,
                bth.dest_qp)
        end
    elseif op == 0xDE then
        local peth = need("peth")
        ok_chain = peth ~= nil
        if peth then info = string.format("MRC PROBE id=%d QP=0x%06x", peth.probe_id, bth.dest_qp) end
    elseif op == 0xD8 or op == 0xD9 then
        local key = op == 0xD8 and "erth" or "eeth"
        local ep = need(key)
        ok_chain = ep ~= nil
        if ep then
            info = string.format("MRC %s %s req=0x%04x ports=0x%08x", opname, name_of(EP_OPS, ep.op, "%d"),
                bit32.band(bth.psn, 0xFFFF), ep.port_status)
            if key == "eeth" then info = info .. string.format(" rx_port=%d", ep.rx_port) end
        end
    else
        tree:add_proto_expert_info(ex_opcode, string.format("Unknown or reserved MRC opcode 0x%02x", op))
        info = string.format("MRC opcode 0x%02x (unknown) QP=0x%06x PSN=%d", op, bth.dest_qp, bth.psn)
        ok_chain = false
    end

    if not is_data(op) and OPCODES[op] then
        if bth.ts then tree:add_proto_expert_info(ex_malformed, "TS bit set on a packet that carries no TSETH") end
        if bth.pad ~= 0 then tree:add_proto_expert_info(ex_malformed, "Pad set on a packet that carries no payload") end
    end
    if off < limit then
        tree:add(pf_undecoded, tvb(off, limit - off))
        if ok_chain then
            tree:add_proto_expert_info(ex_malformed, string.format("%d unexpected byte(s) after the headers",
                limit - off))
        end
    end
    if sech_off then
        local sech = add_header("sech", tvb, sech_off, sech_off + 16, tree)
        local sub = tree
        if sech then
            local hi, lo = tvb(sech_off + 11, 1):uint(), tvb(sech_off + 12, 4):uint()
            tree:add(pf_sech_counter, tvb(sech_off + 11, 5), UInt64.new(lo, hi))
            info = info .. string.format(" [sealed%s epoch=%d sdi=%d ctr=%.0f]", sech.encrypted and " E" or "",
                sech.epoch, sech.sdi, hi * 4294967296 + lo)
        end
        if htag_off then
            sub:add(pf_htag, tvb(htag_off, 16)):append_text(" [not verified here]")
        end
        sub:add(pf_tag, tvb(sech_off + 16, 16)):append_text(" [not verified here: openmrc decode --key]")
    end
    if icrc_ok then
        local range = tvb(len - ICRC_SIZE, ICRC_SIZE)
        local item = tree:add_le(pf_icrc, range)
        local want = mrc.prefs.check_icrc and computed_icrc(tvb) or nil
        if want == nil then
            item:add(pf_icrc_status, range, ICRC_UNVERIFIED):set_generated()
        elseif want == range:le_uint() then
            item:append_text(" [correct]")
            item:add(pf_icrc_status, range, ICRC_GOOD):set_generated()
        else
            item:append_text(string.format(" [incorrect, should be 0x%08x]", want))
            item:add(pf_icrc_status, range, ICRC_BAD):set_generated()
            item:add(pf_icrc_computed, range, want):set_generated()
            item:add_proto_expert_info(ex_icrc, string.format("Bad ICRC: 0x%08x, should be 0x%08x",
                range:le_uint(), want))
            info = info .. " [BAD ICRC]"
        end
    end
    if not ok_chain and OPCODES[op] then info = info .. " [truncated]" end
    pinfo.cols.info = info
end

function mrc.dissector(tvb, pinfo, root)
    local ok, err = pcall(dissect, tvb, pinfo, root)
    if not ok then
        -- Never let a Lua error escape: report it on the packet instead.
        root:add_proto_expert_info(ex_internal, "MRC dissector internal error: " .. tostring(err))
    end
    return tvb:len()
end

---------------------------------------------------------------------------------------------------------
-- Registration on the configured UDP port (restoring whatever dissector it displaced on a change)
---------------------------------------------------------------------------------------------------------
local udp_table = DissectorTable.get("udp.port")
local current_port, displaced

local function register_port(port)
    if port == current_port then return end
    if current_port then
        udp_table:remove(current_port, mrc)
        if displaced then udp_table:add(current_port, displaced) end
    end
    displaced = nil
    if port ~= 0 then
        displaced = udp_table:get_dissector(port)
        udp_table:add(port, mrc)
    end
    current_port = port
end

function mrc.prefs_changed()
    register_port(mrc.prefs.udp_port)
end

register_port(mrc.prefs.udp_port)
