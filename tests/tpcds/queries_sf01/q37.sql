-- TPC-DS q37 with other constants, so that its answer at SF 0.1 has rows
-- (tests/integration/test_tpcds.py; the standard text, tests/tpcds/queries/q37.sql,
-- returns none there).
-- Changed: the manufacturers: 677, 940, 694, 808 -> 168, 647, 160, 842. At SF 0.1 (1,800 items)
-- none of the four has an item priced 68-98 in stock (100-500) in February-March 2000
-- that the catalog sold; the new four have the most such rows.
-- Rows at SF 0.1: 6.
SELECT i_item_id,
       i_item_desc,
       i_current_price
FROM item,
     inventory,
     date_dim,
     catalog_sales
WHERE i_current_price BETWEEN 68 AND 68 + 30
  AND inv_item_sk = i_item_sk
  AND d_date_sk=inv_date_sk
  AND d_date BETWEEN cast('2000-02-01' AS date) AND cast('2000-04-01' AS date)
  AND i_manufact_id IN (168,
                        647,
                        160,
                        842)
  AND inv_quantity_on_hand BETWEEN 100 AND 500
  AND cs_item_sk = i_item_sk
GROUP BY i_item_id,
         i_item_desc,
         i_current_price
ORDER BY i_item_id
LIMIT 100;
